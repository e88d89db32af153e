// Who may act in the tenant: members and their roles, and (owners) invitations. An invitation becomes a membership
// only when the invited user accepts it in their console; the answer is the same whether or not the username exists.
import { Alert, Badge, Button, Group, Select, Stack, Table, Text, TextInput, Title } from '@mantine/core'
import { useQuery, useQueryClient } from '@tanstack/react-query'
import { useState } from 'react'
import { api, unwrap, type Schemas } from '../api/client'
import { useMe, useRole } from '../auth'
import { formatDateTime } from '../format'

type MemberRole = Schemas['RoleEnum']
const ROLES: MemberRole[] = ['viewer', 'member', 'owner']

export function Members() {
  const qc = useQueryClient()
  const { data: me } = useMe()
  const owner = useRole(me) === 'owner'
  const [username, setUsername] = useState('')
  const [role, setRole] = useState('member')
  const [sent, setSent] = useState<string | null>(null)
  const [error, setError] = useState<string | null>(null)
  const members = useQuery({ queryKey: ['members'], queryFn: async () => unwrap(await api.GET('/api/v1/members')) })
  const pending = useQuery({
    queryKey: ['tenant-invitations'],
    queryFn: async () => unwrap(await api.GET('/api/v1/invitations')),
  })
  const invite = async (e: React.FormEvent) => {
    e.preventDefault()
    setError(null)
    setSent(null)
    const res = await api.POST('/api/v1/members', { body: { username, role: role as MemberRole } })
    if (!res.response.ok) {
      setError((res.error as { detail?: string } | undefined)?.detail ?? 'Could not send the invitation.')
      return
    }
    setSent(res.data?.detail ?? 'Invitation saved.')
    setUsername('')
    void qc.invalidateQueries({ queryKey: ['tenant-invitations'] })
  }
  const cancel = async (id: number) => {
    await api.DELETE('/api/v1/invitations/{id}', { params: { path: { id } } })
    void qc.invalidateQueries({ queryKey: ['tenant-invitations'] })
  }
  return (
    <Stack>
      <Title order={2}>Members</Title>
      {owner && (
        <form onSubmit={invite} aria-label="Invite a user">
          <Group align="flex-end" maw={640}>
            <TextInput label="Username" required value={username} onChange={(e) => setUsername(e.currentTarget.value)} />
            <Select label="Role" data={ROLES} value={role} onChange={(v) => v && setRole(v)} allowDeselect={false} w={140} />
            <Button type="submit" disabled={!username}>
              Invite
            </Button>
          </Group>
        </form>
      )}
      {sent && <Alert color="teal" role="status">{sent}</Alert>}
      {error && <Alert color="red">{error}</Alert>}
      <Table.ScrollContainer minWidth={480}>
        <Table striped aria-label="Members">
          <Table.Thead>
            <Table.Tr>
              <Table.Th>Username</Table.Th>
              <Table.Th>Role</Table.Th>
              <Table.Th>Since</Table.Th>
            </Table.Tr>
          </Table.Thead>
          <Table.Tbody>
            {members.data?.map((m) => (
              <Table.Tr key={m.username}>
                <Table.Td>{m.username}</Table.Td>
                <Table.Td>
                  <Badge variant="light">{m.role}</Badge>
                </Table.Td>
                <Table.Td>{formatDateTime(m.created_at)}</Table.Td>
              </Table.Tr>
            ))}
          </Table.Tbody>
        </Table>
      </Table.ScrollContainer>
      <Title order={3}>Pending invitations</Title>
      {pending.data?.length === 0 && <Text c="dimmed">None.</Text>}
      {!!pending.data?.length && (
        <Table.ScrollContainer minWidth={480}>
          <Table striped aria-label="Pending invitations">
            <Table.Thead>
              <Table.Tr>
                <Table.Th>Username</Table.Th>
                <Table.Th>Role</Table.Th>
                <Table.Th>Expires</Table.Th>
                {owner && <Table.Th />}
              </Table.Tr>
            </Table.Thead>
            <Table.Tbody>
              {pending.data.map((inv) => (
                <Table.Tr key={inv.id} data-testid={`pending-${inv.username}`}>
                  <Table.Td>{inv.username}</Table.Td>
                  <Table.Td>{inv.role}</Table.Td>
                  <Table.Td>{formatDateTime(inv.expires_at)}</Table.Td>
                  {owner && (
                    <Table.Td>
                      <Button size="xs" variant="light" color="red" onClick={() => cancel(inv.id)} aria-label={`Cancel ${inv.username}`}>
                        Cancel
                      </Button>
                    </Table.Td>
                  )}
                </Table.Tr>
              ))}
            </Table.Tbody>
          </Table>
        </Table.ScrollContainer>
      )}
    </Stack>
  )
}
