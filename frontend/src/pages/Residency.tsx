// The residency map with the operator actions: pin, unpin, evict (each confirmed and audited) and replicas per
// version; the map polls a page of GET /api/v1/operator/residency (of one tenant when picked), so it changes as
// the next heartbeat reports the engine's state.
import { Alert, Button, Group, Modal, NumberInput, Select, Stack, Text, Title } from '@mantine/core'
import { keepPreviousData, useQuery, useQueryClient } from '@tanstack/react-query'
import { useState } from 'react'
import { api, unwrap } from '../api/client'
import { Pager } from '../components/Pager'
import { pageQuery, useClampedPage } from '../components/paging'
import { ResidencyMap, type MapAction, type MapRow } from '../components/ResidencyMap'
import { TIERS, TierBadge } from '../components/tiers'

function ReplicasForm({ row, onDone }: { row: MapRow; onDone: (text: string, ok: boolean) => void }) {
  const intent = useQuery({
    queryKey: ['operator-intent', row.versionId],
    queryFn: async () => unwrap(await api.GET('/api/v1/operator/versions/{id}', { params: { path: { id: row.versionId } } })),
  })
  const [min, setMin] = useState<number | string>('')
  const [max, setMax] = useState<number | string>('')
  if (!intent.data) return <Text>Loading…</Text>
  const minValue = min === '' ? intent.data.min_replicas : Number(min)
  const maxValue = max === '' ? intent.data.max_replicas : Number(max)
  const save = async () => {
    const res = await api.PUT('/api/v1/operator/versions/{id}/replicas', {
      params: { path: { id: row.versionId } },
      body: { min_replicas: minValue, max_replicas: maxValue ?? null },
    })
    const err = res.error as { detail?: string } | undefined
    onDone(res.response.ok ? `replicas of ${row.label}: ${minValue}–${maxValue ?? 'auto'}` : err?.detail ?? `HTTP ${res.response.status}`, res.response.ok)
  }
  return (
    <Stack>
      <NumberInput label="Minimum replicas" min={1} max={64} value={minValue} onChange={(v) => setMin(v as number | string)} />
      <NumberInput label="Maximum replicas" description="Empty: the placement default" min={1} max={64} value={maxValue ?? ''} onChange={(v) => setMax(v as number | string)} />
      <Text size="sm">This is recorded in the audit log.</Text>
      <Button onClick={save}>Confirm replicas</Button>
    </Stack>
  )
}

/** Adapter versions per page of the map (the API's default page). */
export const MAP_PAGE = 50

export function Residency() {
  const qc = useQueryClient()
  const [tenant, setTenant] = useState<string | null>(null)
  const [page, setPage] = useState(1)
  const [pending, setPending] = useState<MapAction | null>(null)
  const [replicas, setReplicas] = useState<MapRow | null>(null)
  const [message, setMessage] = useState<{ ok: boolean; text: string } | null>(null)
  const map = useQuery({
    queryKey: ['operator-residency', tenant, page],
    queryFn: async () =>
      unwrap(await api.GET('/api/v1/operator/residency', { params: { query: { ...pageQuery(page, MAP_PAGE), ...(tenant ? { tenant } : {}) } } })),
    refetchInterval: 2000,
    placeholderData: keepPreviousData,
  })
  useClampedPage(page, setPage, map.data?.count, MAP_PAGE)
  const tenants = useQuery({ queryKey: ['operator-tenants'], queryFn: async () => unwrap(await api.GET('/api/v1/operator/tenants')) })
  const done = (text: string, ok: boolean) => {
    setMessage({ ok, text })
    void qc.invalidateQueries({ queryKey: ['operator-residency'] })
    void qc.invalidateQueries({ queryKey: ['operator-audit'] })
  }
  const run = async (a: MapAction) => {
    setPending(null)
    const res =
      a.kind === 'evict'
        ? await api.POST('/api/v1/operator/placements/{id}/evict', { params: { path: { id: a.placementId } } })
        : await api.POST(a.kind === 'pin' ? '/api/v1/operator/versions/{id}/pin' : '/api/v1/operator/versions/{id}/unpin', {
            params: { path: { id: a.versionId } },
            body: { node: a.node },
          })
    const err = res.error as { detail?: string } | undefined
    done(res.response.ok ? `${a.kind} ${a.label} on ${a.node}: requested; the next heartbeat shows it.` : err?.detail ?? `HTTP ${res.response.status}`, res.response.ok)
  }
  if (map.error) return <Text role="alert">{(map.error as Error).message}</Text>
  return (
    <Stack>
      <Title order={2}>Residency map</Title>
      <Group justify="space-between" align="flex-end">
        <Select
          label="Tenant"
          placeholder="All tenants"
          clearable
          data={(tenants.data ?? []).map((t) => ({ value: t.slug, label: t.name }))}
          value={tenant}
          onChange={(v) => {
            setTenant(v as string | null)
            setPage(1)
          }}
          w={240}
        />
        <Group gap={4} aria-label="Tiers">
          {TIERS.map((tier) => (
            <TierBadge key={tier} tier={tier} />
          ))}
        </Group>
      </Group>
      {message && (
        <Alert color={message.ok ? 'green' : 'red'} role="status" withCloseButton onClose={() => setMessage(null)}>
          {message.text}
        </Alert>
      )}
      <Modal opened={!!pending} onClose={() => setPending(null)} title="Confirm operator action">
        {pending && (
          <Stack>
            <Text>
              {pending.kind === 'evict'
                ? `Evict ${pending.label} from ${pending.node}'s engine now? Its next request reloads it from disk.`
                : `${pending.kind === 'pin' ? 'Pin' : 'Unpin'} ${pending.label} on ${pending.node}?`}{' '}
              This is recorded in the audit log.
            </Text>
            <Group>
              <Button color={pending.kind === 'evict' ? 'red' : 'blue'} onClick={() => run(pending)}>
                Confirm {pending.kind}
              </Button>
              <Button variant="default" onClick={() => setPending(null)}>
                Cancel
              </Button>
            </Group>
          </Stack>
        )}
      </Modal>
      <Modal opened={!!replicas} onClose={() => setReplicas(null)} title={replicas ? `Replicas of ${replicas.label}` : ''}>
        {replicas && <ReplicasForm row={replicas} onDone={(text, ok) => { setReplicas(null); done(text, ok) }} />}
      </Modal>
      <Pager label="Pages of adapter versions" page={page} size={MAP_PAGE} count={map.data?.count ?? 0} onChange={setPage} />
      <ResidencyMap versions={map.data?.results ?? []} tenant={tenant} onAction={setPending} onReplicas={setReplicas} />
    </Stack>
  )
}
