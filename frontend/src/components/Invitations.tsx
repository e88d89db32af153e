// Invitations addressed to the signed-in user (GET /api/v1/auth/invitations): a tenant owner's offer becomes a
// membership only when the user accepts it here (membership by consent; tenants/invitations.py).
import { Alert, Button, Group, Stack, Text } from '@mantine/core'
import { useQuery, useQueryClient } from '@tanstack/react-query'
import { useState } from 'react'
import { api, currentTenant, setCurrentTenant, unwrap, type Me, type MyInvitation } from '../api/client'
import { formatDateTime } from '../format'

/** The user's pending invitations, refreshed every minute. */
function useMyInvitations() {
  return useQuery<MyInvitation[]>({
    queryKey: ['invitations'],
    queryFn: async () => unwrap(await api.GET('/api/v1/auth/invitations')),
    refetchInterval: 60_000,
  })
}

/** One alert per pending invitation, with Accept and Decline; nothing when there is none. */
export function InvitationsBanner() {
  const qc = useQueryClient()
  const { data } = useMyInvitations()
  const [busy, setBusy] = useState<number | null>(null)
  const [error, setError] = useState<string | null>(null)
  if (!data?.length) return null
  const answer = async (inv: MyInvitation, verb: 'accept' | 'decline') => {
    setBusy(inv.id)
    setError(null)
    const path = { params: { path: { invitation_id: inv.id } } }
    const res = verb === 'accept'
      ? await api.POST('/api/v1/auth/invitations/{invitation_id}/accept', path)
      : await api.POST('/api/v1/auth/invitations/{invitation_id}/decline', path)
    setBusy(null)
    if (!res.response.ok) {
      setError((res.error as { detail?: string } | undefined)?.detail ?? `Could not ${verb} the invitation.`)
    } else if (verb === 'accept') {
      // The tenant acted in stays chosen; a user who had none lands in the one just joined.
      const me = res.data as Me
      if (!currentTenant()) setCurrentTenant(me.tenant ?? inv.tenant)
      qc.setQueryData(['me'], me)
    }
    await qc.invalidateQueries()
  }
  return (
    <Stack gap="xs" mb="md" aria-label="Invitations">
      {data.map((inv) => (
        <Alert key={inv.id} color="indigo" title={`Invitation to ${inv.tenant_name}`} data-testid={`invitation-${inv.tenant}`}>
          <Group justify="space-between" wrap="wrap">
            <Text size="sm">
              {inv.invited_by ?? 'A tenant owner'} invited you to join <b>{inv.tenant_name}</b> ({inv.tenant}) as{' '}
              <b>{inv.role}</b>. Until you accept, you are not a member. Expires {formatDateTime(inv.expires_at)}.
            </Text>
            <Group gap="xs">
              <Button size="xs" loading={busy === inv.id} onClick={() => answer(inv, 'accept')}>
                Accept
              </Button>
              <Button size="xs" variant="default" disabled={busy === inv.id} onClick={() => answer(inv, 'decline')}>
                Decline
              </Button>
            </Group>
          </Group>
        </Alert>
      ))}
      {error && <Alert color="red">{error}</Alert>}
    </Stack>
  )
}
