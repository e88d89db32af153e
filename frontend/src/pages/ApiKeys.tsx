// API keys of the tenant: create (scopes, expiry, adapters, per-key limits), see, edit a key's limits, revoke.
import { Alert, Badge, Button, Checkbox, CopyButton, Code, Fieldset, Group, Modal, Stack, Table, Text, TextInput, Title } from '@mantine/core'
import { useQuery, useQueryClient } from '@tanstack/react-query'
import { useState } from 'react'
import { api, unwrap, type ApiKey, type ApiKeyCreated } from '../api/client'
import { useMe, useRole } from '../auth'
import { KeyLimitsFields } from '../components/KeyLimitsFields'
import { parseAdapterList } from '../components/keyAdapters'
import { changedLimits, createLimits, draftErrorText, draftOf, emptyDraft, limitError, limitsText, type LimitsDraft } from '../components/keyLimits'
import { expiryInstant } from '../components/expiry'
import { formatDateTime } from '../format'

const SCOPES = ['adapters:read', 'adapters:write', 'inference', 'keys:manage']

export function ApiKeys() {
  const qc = useQueryClient()
  const { data: me } = useMe()
  const role = useRole(me)
  const [name, setName] = useState('')
  const [scopes, setScopes] = useState<string[]>(['inference'])
  const [expiryDate, setExpiryDate] = useState('')
  const [expiryTime, setExpiryTime] = useState('')
  const [adapters, setAdapters] = useState('')
  const [created, setCreated] = useState<ApiKeyCreated | null>(null)
  const [error, setError] = useState<string | null>(null)
  const [limits, setLimits] = useState<LimitsDraft>(emptyDraft)
  const [limitErrors, setLimitErrors] = useState<Record<string, string>>({})
  const [revoking, setRevoking] = useState<string | null>(null)
  const [editing, setEditing] = useState<ApiKey | null>(null)
  const keys = useQuery({ queryKey: ['api-keys'], queryFn: async () => unwrap(await api.GET('/api/v1/api-keys')), enabled: role !== 'viewer' })
  if (role === 'viewer') return <Text>Viewers cannot manage API keys; ask a member or owner of this tenant.</Text>
  const expiry = expiryInstant(expiryDate, expiryTime)
  const only = parseAdapterList(adapters)
  const create = async (e: React.FormEvent) => {
    e.preventDefault()
    setError(null)
    setLimitErrors({})
    if (expiry.error) return setError(`Expires: ${expiry.error.text}`)
    if (only.error) return setError(`Only these adapters: ${only.error}`)
    const badLimit = draftErrorText(limits)
    if (badLimit) return setError(badLimit)
    try {
      const body = unwrap(
        await api.POST('/api/v1/api-keys', {
          body: {
            name,
            scopes: scopes as never,
            expires_at: expiry.iso,
            adapters: only.names,
            ...createLimits(limits),
          },
        }),
      )
      setCreated(body as ApiKeyCreated)
    } catch (err) {
      const refused = limitError(err)
      setError(refused.text)
      setLimitErrors(refused.fields)
      return
    }
    // The whole form back to its start, the adapter allow-list and expiry included: kept, they went unnoticed
    // into the next key.
    setName('')
    setScopes(['inference'])
    setExpiryDate('')
    setExpiryTime('')
    setAdapters('')
    setLimits(emptyDraft())
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
          <Group grow align="flex-start">
            <TextInput
              label="Expires on (optional)"
              type="date"
              value={expiryDate}
              onChange={(e) => setExpiryDate(e.currentTarget.value)}
              error={expiry.error?.field === 'date' ? expiry.error.text : null}
            />
            <TextInput
              label="at (24-hour, HH:MM)"
              placeholder="00:00"
              inputMode="numeric"
              value={expiryTime}
              onChange={(e) => setExpiryTime(e.currentTarget.value)}
              error={expiry.error?.field === 'time' ? expiry.error.text : null}
              description={expiry.iso ? `Expires ${formatDateTime(expiry.iso)}, your time zone` : 'Your time zone; empty: 00:00'}
            />
          </Group>
          <TextInput
            label="Only these adapters (optional)"
            description="Names or name@N, comma-separated; any other model is a 404 for this key."
            placeholder="support-bot, ranker@2"
            value={adapters}
            onChange={(e) => setAdapters(e.currentTarget.value)}
            error={only.error}
          />
          <Fieldset legend="Limits of this key (optional)">
            <Text size="xs" c="dimmed" mb="xs">
              The tenant's limits still apply beside these; the tighter one binds.
              {role !== 'owner' && " Owners' limits on your keys bind the keys you create."}
            </Text>
            <KeyLimitsFields draft={limits} onChange={setLimits} errors={limitErrors} />
          </Fieldset>
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
            {created.warning && (
              <Alert color="yellow" title="Not uploaded yet" data-testid="new-key-warning">
                {created.warning}
              </Alert>
            )}
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
              <Table.Th>Limits</Table.Th>
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
                <Table.Td>
                  <Text size="sm">{limitsText(k)}</Text>
                  {k.enabled && (
                    <Button size="compact-xs" variant="subtle" onClick={() => setEditing(k)} aria-label={`Edit limits of ${k.name}`}>
                      Edit limits
                    </Button>
                  )}
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
      {editing && (
        <EditLimits
          apiKey={editing}
          owner={role === 'owner'}
          onClose={() => setEditing(null)}
          onSaved={() => {
            setEditing(null)
            void qc.invalidateQueries({ queryKey: ['api-keys'] })
          }}
        />
      )}
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

/** The dialog that edits one key's limits: sends only what changed (`PATCH`), and shows the API's refusal (a
 *  member raising or clearing a limit is a 403 naming the field; a bad value a 400 with `fields`). */
export function EditLimits({ apiKey, owner, onClose, onSaved }: {
  apiKey: ApiKey
  owner: boolean
  onClose: () => void
  onSaved: () => void
}) {
  const [draft, setDraft] = useState<LimitsDraft>(() => draftOf(apiKey))
  const [refused, setRefused] = useState<{ text: string; fields: Record<string, string> } | null>(null)
  const [saving, setSaving] = useState(false)
  const save = async (e: React.FormEvent) => {
    e.preventDefault()
    const badLimit = draftErrorText(draft)
    if (badLimit) return setRefused({ text: badLimit, fields: {} })
    const body = changedLimits(apiKey, draft)
    if (Object.keys(body).length === 0) return onClose()
    setSaving(true)
    setRefused(null)
    try {
      unwrap(await api.PATCH('/api/v1/api-keys/{key_id}', { params: { path: { key_id: apiKey.key_id } }, body }))
      onSaved()
    } catch (err) {
      setRefused(limitError(err))
    } finally {
      setSaving(false)
    }
  }
  return (
    <Modal opened onClose={onClose} title={`Limits of ${apiKey.name}`} size="lg">
      <form onSubmit={save} aria-label={`Limits of ${apiKey.name}`}>
        <Stack gap="sm">
          <Text size="sm" c="dimmed">
            The tenant's limits still apply; the tighter one binds. The gateway applies a change within a second.
            {!owner && ' Members may tighten a limit; only an owner can raise or clear one.'}
          </Text>
          <KeyLimitsFields draft={draft} onChange={setDraft} errors={refused?.fields} />
          {refused && (
            <Alert color="red" role="alert">
              {refused.text}
            </Alert>
          )}
          <Group>
            <Button type="submit" loading={saving}>
              Save limits
            </Button>
            <Button variant="default" onClick={onClose}>
              Cancel
            </Button>
          </Group>
        </Stack>
      </form>
    </Modal>
  )
}
