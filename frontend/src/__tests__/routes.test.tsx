import { QueryClient, QueryClientProvider } from '@tanstack/react-query'
import { cleanup, screen, waitFor } from '@testing-library/react'
import userEvent from '@testing-library/user-event'
import { RouterProvider, createMemoryRouter } from 'react-router'
import { afterEach, describe, expect, it, vi } from 'vitest'
import type { Me } from '../api/client'
import { setCurrentTenant } from '../api/client'
import { renderWithMantine } from '../components/__tests__/render'
import { routeErrorMessage } from '../routeError'
import { RouteError } from '../RouteErrors'
import { routes } from '../routes'

const owner: Me = { username: 'olga', email: '', is_staff: false, tenant: 'demo', tenants: [{ slug: 'demo', name: 'Demo', role: 'owner' }] }

const renderRouter = (router: ReturnType<typeof createMemoryRouter>) => {
  const qc = new QueryClient({ defaultOptions: { queries: { retry: false, staleTime: Infinity } } })
  qc.setQueryData(['me'], owner)
  qc.setQueryData(['invitations'], [])
  qc.setQueryData(['adapters'], [])
  setCurrentTenant('demo')
  renderWithMantine(<QueryClientProvider client={qc}><RouterProvider router={router} /></QueryClientProvider>)
}

describe('unknown addresses and page errors', () => {
  afterEach(() => {
    cleanup()
    setCurrentTenant(null)
    vi.restoreAllMocks()
  })

  it('shows the console not-found page inside the shell for an unknown URL, with a way back', async () => {
    const router = createMemoryRouter(routes, { initialEntries: ['/nonexistent'] })
    renderRouter(router)
    expect(await screen.findByRole('heading', { name: 'Page not found' })).toBeInTheDocument()
    expect(screen.getByRole('alert')).toHaveTextContent('Nothing lives at /nonexistent')
    expect(screen.queryByText(/Hey developer/)).not.toBeInTheDocument()
    expect(screen.getByRole('navigation', { name: 'Main' })).toHaveTextContent('Adapters') // the menu stays
    await userEvent.click(screen.getByRole('link', { name: "Go to the console's start page" }))
    // `/` lands an owner on their adapters (a lazy page: the location moves once its chunk has loaded)
    await waitFor(() => expect(router.state.location.pathname).toBe('/adapters'), { timeout: 10_000 })
  })

  it('shows a page that throws as an error with a reload, never the developer page', async () => {
    vi.spyOn(console, 'error').mockImplementation(() => {}) // React logs the caught error
    const Boom = () => {
      throw new Error('quota is undefined')
    }
    const router = createMemoryRouter([{ path: '/', element: <Boom />, errorElement: <RouteError /> }])
    renderRouter(router)
    expect(await screen.findByRole('heading', { name: 'This page hit an error' })).toBeInTheDocument()
    expect(screen.getByRole('alert')).toHaveTextContent('quota is undefined')
    expect(screen.getByRole('button', { name: 'Reload the page' })).toBeInTheDocument()
    expect(screen.getByRole('link', { name: "Go to the console's start page" })).toHaveAttribute('href', '/')
  })

  it('asks for a reload when a page chunk is gone after a redeploy', () => {
    const gone = new TypeError('Failed to fetch dynamically imported module: /static/assets/Usage-abc.js')
    expect(routeErrorMessage(gone)).toEqual({
      title: 'This page could not be loaded',
      detail: 'The console may have been updated since this tab opened: reload the page.',
    })
  })
})
