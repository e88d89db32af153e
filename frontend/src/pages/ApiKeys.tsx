import { Alert, Badge, Button, Checkbox, CopyButton, Code, Group, Modal, Stack, Table, Text, TextInput, Title } from '@mantine/core'
import { useQuery, useQueryClient } from '@tanstack/react-query'
import { useState } from 'react'
import { api, unwrap, type ApiKeyCreated } from '../api/client'
import { useMe, useRole } from '../auth'
import { formatDateTime } from '../format'

const SCOPES = ['adapters:read', 'adapters:write', 'inference', 'keys:manage']

export function ApiKeys() {
  const qc = useQueryClient()
  const { data: me } = useMe()
  const role = useRole(me)
  const [name, setName] = useState('')
  const [scopes, setScopes] = useState<string[]>(['inference'])
  const [expires, setExpires] = useState('')
  const [adapters, setAdapters] = useState('')
  const [created, setCreated] = useState<ApiKeyCreated | null>(null)
  const [error, setError] = useState<string | null>(null)
  const [revoking, setRevoking] = useState<string | null>(null)
  const keys = useQuery({ queryKey: ['api-keys'], queryFn: async () => unwrap(await api.GET('/api/v1/api-keys')), enabled: role !== 'viewer' })
  if (role === 'viewer') return <Text>Viewers cannot manage API keys; ask a member or owner of this tenant.</Text>
  const create = async (e: React.FormEvent) => {
    e.preventDefault()
    setError(null)
    const res = await api.POST('/api/v1/api-keys', {
      body: {
        name,
        scopes: scopes as never,
        expires_at: expires ? new Date(expires).toISOString() : null,
        adapters: adapters.split(/[\s,]+/).filter(Boolean),
      },
    })
    if (!res.response.ok) {
      setError((res.error as { detail?: string })?.detail ?? 'Could not create the key.')
      return
    }
    setCreated(res.data as ApiKeyCreated)
    setName('')
    void qc.invalidateQueries({ queryKey: ['api-keys'] })
  }
  const revoke = async (keyId: string) => {
    await api.POST('/api/v1/api-keys/{key_id}/revoke', { params: { path: { key_id: keyId } } })
    setRevoking(null)
    void qc.invalidateQueries({ queryKey: ['api-keys'] })
  }
  return (
    <Stack>
      <Title order={2}>API keys</Title>
      <form onSubmit={create} aria-label="Create an API key">
        <Stack gap="sm" maw={560}>
          <TextInput label="Name" required value={name} onChange={(e) => setName(e.currentTarget.value)} />
          <Checkbox.Group label="Scopes" value={scopes} onChange={setScopes}>
            <Group mt={4}>
              {SCOPES.filter((s) => role === 'owner' || s !== 'keys:manage').map((s) => (
                <Checkbox key={s} value={s} label={s} />
              ))}
            </Group>
          </Checkbox.Group>
          <TextInput label="Expires (optional)" type="datetime-local" value={expires} onChange={(e) => setExpires(e.currentTarget.value)} />
          <TextInput
            label="Only these adapters (optional)"
            description="Names or name@N, comma-separated; any other model is a 404 for this key."
            placeholder="support-bot, ranker@2"
            value={adapters}
            onChange={(e) => setAdapters(e.currentTarget.value)}
          />
          {error && <Alert color="red">{error}</Alert>}
          <Group>
            <Button type="submit" disabled={!name || scopes.length === 0}>
              Create key
            </Button>
          </Group>
        </Stack>
      </form>
      <Modal opened={!!created} onClose={() => setCreated(null)} title="Your new API key" size="lg">
        {created && (
          <Stack>
            <Text>Copy it now: this is the only time the secret is shown.</Text>
            <Code block data-testid="new-secret" style={{ wordBreak: 'break-all' }}>
              {created.secret}
            </Code>
            <CopyButton value={created.secret}>
              {({ copied, copy }) => (
                <Button onClick={copy} color={copied ? 'teal' : 'blue'}>
                  {copied ? 'Copied' : 'Copy to clipboard'}
                </Button>
              )}
            </CopyButton>
            <Button variant="default" onClick={() => setCreated(null)}>
              Done
            </Button>
          </Stack>
        )}
      </Modal>
      <Table.ScrollContainer minWidth={640}>
        <Table striped aria-label="API keys">
          <Table.Thead>
            <Table.Tr>
              <Table.Th>Name</Table.Th>
              <Table.Th>Key</Table.Th>
              <Table.Th>Scopes</Table.Th>
              <Table.Th>Expires</Table.Th>
              <Table.Th>Last used</Table.Th>
              <Table.Th>State</Table.Th>
            </Table.Tr>
          </Table.Thead>
          <Table.Tbody>
            {keys.data?.map((k) => (
              <Table.Tr key={k.key_id} data-testid={`key-${k.name}`}>
                <Table.Td>{k.name}</Table.Td>
                <Table.Td>
                  <Code>{k.key}</Code>
                </Table.Td>
                <Table.Td>
                  {k.scopes.join(', ')}
                  {k.adapters.length > 0 && <Text size="xs">only {k.adapters.join(', ')}</Text>}
                </Table.Td>
                <Table.Td>{k.expires_at ? formatDateTime(k.expires_at) : 'never'}</Table.Td>
                <Table.Td>{k.last_used_at ? formatDateTime(k.last_used_at) : 'never'}</Table.Td>
                <Table.Td>
                  {k.enabled ? (
                    <Button size="xs" color="red" variant="light" onClick={() => setRevoking(k.key_id)} aria-label={`Revoke ${k.name}`}>
                      Revoke
                    </Button>
                  ) : (
                    <Badge color="gray">revoked</Badge>
                  )}
                </Table.Td>
              </Table.Tr>
            ))}
          </Table.Tbody>
        </Table>
      </Table.ScrollContainer>
      <Modal opened={!!revoking} onClose={() => setRevoking(null)} title="Revoke this key?">
        <Stack>
          <Text>Applications using it stop working at once. This cannot be undone.</Text>
          <Group>
            <Button color="red" onClick={() => revoking && revoke(revoking)}>
              Revoke key
            </Button>
            <Button variant="default" onClick={() => setRevoking(null)}>
              Keep it
            </Button>
          </Group>
        </Stack>
      </Modal>
    </Stack>
  )
}
