import { QueryClient, QueryClientProvider } from '@tanstack/react-query'
import { screen, waitFor } from '@testing-library/react'
import userEvent from '@testing-library/user-event'
import { afterEach, describe, expect, it, vi } from 'vitest'
import { api, currentTenant, setCurrentTenant, type Me, type MyInvitation } from '../api/client'
import { InvitationsBanner } from '../components/Invitations'
import { renderWithMantine } from '../components/__tests__/render'

const invitation: MyInvitation = {
  id: 7, tenant: 'acme', tenant_name: 'Acme', role: 'member', invited_by: 'olga',
  created_at: '2026-01-01T00:00:00Z', expires_at: '2026-01-15T00:00:00Z',
}
const joined: Me = {
  username: 'newbie', email: '', is_staff: false, tenant: 'acme',
  tenants: [{ slug: 'acme', name: 'Acme', role: 'member' }],
}

function renderBanner(pending: MyInvitation[]) {
  const qc = new QueryClient({ defaultOptions: { queries: { retry: false, staleTime: Infinity } } })
  qc.setQueryData(['invitations'], pending)
  renderWithMantine(<QueryClientProvider client={qc}><InvitationsBanner /></QueryClientProvider>)
  return qc
}

describe('InvitationsBanner', () => {
  afterEach(() => {
    vi.restoreAllMocks()
    setCurrentTenant(null)
  })

  it('shows nothing without invitations', () => {
    renderBanner([])
    expect(screen.queryByText(/invited you/)).toBeNull()
  })

  it('says who invited whom to what, and accepting posts to the accept route and lands in the tenant', async () => {
    const post = vi.spyOn(api, 'POST').mockResolvedValue(
      { data: joined, error: undefined, response: new Response('{}', { status: 200 }) } as never)
    vi.spyOn(api, 'GET').mockResolvedValue(
      { data: [], error: undefined, response: new Response('[]', { status: 200 }) } as never)
    const qc = renderBanner([invitation])
    expect(screen.getByText(/olga invited you to join/)).toHaveTextContent('Acme (acme) as member')
    await userEvent.click(screen.getByRole('button', { name: 'Accept' }))
    await waitFor(() => expect(post).toHaveBeenCalledWith('/api/v1/auth/invitations/{invitation_id}/accept',
      { params: { path: { invitation_id: 7 } } }))
    await waitFor(() => expect(qc.getQueryData(['me'])).toEqual(joined))
    expect(currentTenant()).toBe('acme')
  })
})
