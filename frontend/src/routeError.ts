// Words for an error a route threw (RouteErrors.tsx shows them): pure, so tests need no router.
import { isRouteErrorResponse } from 'react-router'

/** The message for an error a route threw: a 404 response is "not found"; a failed dynamic import (the console
 * was redeployed and the old page's chunk is gone) asks for a reload, since that is what fixes it. */
export function routeErrorMessage(error: unknown): { title: string; detail: string } {
  if (isRouteErrorResponse(error)) {
    return error.status === 404
      ? { title: 'Page not found', detail: 'No console page has this address.' }
      : { title: `The page failed (${error.status})`, detail: error.statusText || 'The server answered with an error.' }
  }
  const message = error instanceof Error ? error.message : String(error)
  if (/dynamically imported module|Loading chunk|Importing a module script failed/i.test(message)) {
    return { title: 'This page could not be loaded', detail: 'The console may have been updated since this tab opened: reload the page.' }
  }
  return { title: 'This page hit an error', detail: message || 'Unknown error.' }
}
