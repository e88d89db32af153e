import { QueryClient, QueryClientProvider } from '@tanstack/react-query'
import { cleanup, screen, within } from '@testing-library/react'
import { RouterProvider, createMemoryRouter } from 'react-router'
import { afterEach, describe, expect, it } from 'vitest'
import type { Me } from '../api/client'
import { setCurrentTenant } from '../api/client'
import { renderWithMantine } from '../components/__tests__/render'
import { landingPath, navItems, tenantPlaceholder } from '../nav'
import { Landing, Shell } from '../Shell'

const me = (over: Partial<Me>): Me => ({ username: 'u', email: '', is_staff: false, tenant: 'demo', tenants: [], ...over })
const operator = me({ username: 'operator', is_staff: true, tenants: [{ slug: 'demo', name: 'Demo Tenant', role: 'viewer' }] })
const owner = me({ username: 'olga', tenants: [{ slug: 'demo', name: 'Demo Tenant', role: 'owner' }] })

describe('navItems', () => {
  it('gives an operator the operator pages first, and the tenant pages a viewer cannot use disabled with the reason', () => {
    const items = navItems(operator, 'demo')
    expect(items.map((i) => i.label)).toEqual(['Fleet', 'Residency map', 'Traffic', 'Tenants and quotas', 'Audit log', 'Adapters', 'API keys', 'Playground', 'Usage', 'Members'])
    const disabled = Object.fromEntries(items.filter((i) => i.disabledReason).map((i) => [i.label, i.disabledReason]))
    expect(disabled).toEqual({
      'API keys': 'Needs the member role in demo; yours is viewer.',
      Playground: 'Needs the member role in demo; yours is viewer.',
    })
    expect(landingPath(operator)).toBe('/operator/nodes')
  })

  it('gives a tenant owner every tenant page and no operator page', () => {
    const items = navItems(owner, 'demo')
    expect(items.map((i) => [i.label, i.disabledReason])).toEqual([
      ['Adapters', undefined], ['API keys', undefined], ['Playground', undefined], ['Usage', undefined],
      ['Members', undefined]])
    expect(landingPath(owner)).toBe('/adapters')
    expect(navItems(owner, null)).toEqual([]) // no tenant chosen yet: the picker, no tenant pages
  })
})

describe('Shell', () => {
  afterEach(() => setCurrentTenant(null))

  const renderAt = (who: Me, path: string) => {
    const qc = new QueryClient({ defaultOptions: { queries: { retry: false, staleTime: Infinity } } })
    qc.setQueryData(['me'], who)
    qc.setQueryData(['invitations'], [])
    setCurrentTenant(who.tenant)
    const Page = ({ name }: { name: string }) => <h2>{name} page</h2>
    const router = createMemoryRouter([{
      path: '/', element: <Shell />, children: [
        { index: true, element: <Landing /> },
        { path: 'adapters', element: <Page name="Adapters" /> },
        { path: 'keys', element: <Page name="Keys" /> },
        { path: 'operator/nodes', element: <Page name="Fleet" /> },
      ],
    }], { initialEntries: [path] })
    renderWithMantine(<QueryClientProvider client={qc}><RouterProvider router={router} /></QueryClientProvider>)
    return router
  }

  it('lands an operator on the fleet, with no link to pages their role cannot use', async () => {
    const router = renderAt(operator, '/')
    expect(await screen.findByRole('heading', { name: 'Fleet page' })).toBeInTheDocument()
    expect(router.state.location.pathname).toBe('/operator/nodes')
    const nav = screen.getByRole('navigation', { name: 'Main' })
    expect(within(nav).getByRole('link', { name: 'Fleet' })).toBeInTheDocument()
    expect(within(nav).queryByRole('link', { name: /API keys/ })).toBeNull()
    expect(within(nav).queryByRole('link', { name: /Playground/ })).toBeNull()
    expect(within(nav).getAllByText('Needs the member role in demo; yours is viewer.')).toHaveLength(2)
  })

  it('explains instead of showing a page the role cannot use, opened by its URL', async () => {
    renderAt(operator, '/keys')
    expect(await screen.findByRole('alert')).toHaveTextContent('Needs the member role in demo; yours is viewer.')
    expect(screen.queryByRole('heading', { name: 'Keys page' })).toBeNull()
  })

  it('shows the chosen tenant in the header, and an operator with two tenants and none chosen a default, not a question', async () => {
    const tenants: Me['tenants'] = [{ slug: 'acme', name: 'Acme', role: 'viewer' }, { slug: 'beta', name: 'Beta', role: 'viewer' }]
    const twoTenants = me({ username: 'operator', is_staff: true, tenant: null, tenants })
    expect(tenantPlaceholder(twoTenants)).toBe('All tenants (operator)')
    expect(tenantPlaceholder(me({ tenant: null, tenants }))).toBe('Pick a tenant') // a member of both must choose
    renderAt(twoTenants, '/operator/nodes')
    await screen.findByRole('heading', { name: 'Fleet page' })
    const picker = screen.getByRole('combobox', { name: 'Tenant' })
    expect(picker).toHaveAttribute('placeholder', 'All tenants (operator)')
    expect(picker).toHaveValue('')
    cleanup()
    renderAt({ ...twoTenants, tenant: 'beta' }, '/operator/nodes')
    await screen.findByRole('heading', { name: 'Fleet page' })
    expect(screen.getByRole('combobox', { name: 'Tenant' })).toHaveValue('Beta (viewer)')
  })

  it('lands a tenant owner on the adapters', async () => {
    renderAt(owner, '/')
    expect(await screen.findByRole('heading', { name: 'Adapters page' })).toBeInTheDocument()
  })
})
