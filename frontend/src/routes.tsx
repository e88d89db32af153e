// The console's route table, apart from main.tsx so tests render the same routes in a memory router.
import type { ComponentType } from 'react'
import type { RouteObject } from 'react-router'
import { NotFound, RouteError } from './RouteErrors'
import { Landing, Shell } from './Shell'
import { Login } from './pages/Login'

// One chunk per page (React Router's `lazy`): the first load fetches the shell and the page it lands on only.
const page = (load: () => Promise<Record<string, unknown>>, name: string) => ({
  lazy: async () => ({ Component: (await load())[name] as ComponentType }),
})

/** Every console route. An error in a page (a throw, a chunk that failed to load) shows {@link RouteError} inside
 * the shell, so the menu stays; one in the shell or the login form replaces the whole screen with it. An unknown
 * address is {@link NotFound}, also inside the shell (signed out, the shell sends it to the login first). */
export const routes: RouteObject[] = [
  { path: '/login', element: <Login />, errorElement: <RouteError /> },
  {
    path: '/',
    element: <Shell />,
    errorElement: <RouteError />,
    HydrateFallback: () => null,
    children: [
      {
        errorElement: <RouteError />,
        children: [
          { index: true, element: <Landing /> },
          { path: 'adapters', ...page(() => import('./pages/Adapters'), 'Adapters') },
          { path: 'adapters/:name', ...page(() => import('./pages/AdapterDetail'), 'AdapterDetail') },
          { path: 'keys', ...page(() => import('./pages/ApiKeys'), 'ApiKeys') },
          { path: 'playground', ...page(() => import('./pages/Playground'), 'Playground') },
          { path: 'usage', ...page(() => import('./pages/Usage'), 'Usage') },
          { path: 'members', ...page(() => import('./pages/Members'), 'Members') },
          { path: 'operator/nodes', ...page(() => import('./pages/Nodes'), 'Nodes') },
          { path: 'operator/residency', ...page(() => import('./pages/Residency'), 'Residency') },
          { path: 'operator/traffic', ...page(() => import('./pages/Traffic'), 'Traffic') },
          { path: 'operator/tenants', ...page(() => import('./pages/Tenants'), 'Tenants') },
          { path: 'operator/audit', ...page(() => import('./pages/Audit'), 'Audit') },
          { path: '*', element: <NotFound /> },
        ],
      },
    ],
  },
]
