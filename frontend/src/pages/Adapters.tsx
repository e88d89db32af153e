import { Anchor, Badge, Group, Stack, Table, Text, Title } from '@mantine/core'
import { useQuery, useQueryClient } from '@tanstack/react-query'
import { Link } from 'react-router'
import { api, unwrap, type Adapter } from '../api/client'
import { useMe, useRole } from '../auth'
import { StatusBadge, isSettled } from '../components/StatusBadge'
import { TierBadge, tierCounts } from '../components/tiers'
import { TrafficSparkline } from '../components/TrafficTable'
import { ruleText } from '../components/serving'
import { UploadPanel } from '../components/UploadPanel'
import type { Report } from '../components/ValidationReport'
import { warningCount } from '../components/warnings'
import type { TrafficRow } from '../api/client'

export function useBaseModels() {
  return useQuery({
    queryKey: ['base-models'],
    queryFn: async () => unwrap(await api.GET('/api/v1/base-models')).map((b) => b.base_model_name),
  })
}

/** Requests per minute over the last hour per adapter name, summed over its versions and `name@n` forms. */
export function sparksByAdapter(rows: TrafficRow[]): Map<string, number[]> {
  const out = new Map<string, number[]>()
  for (const r of rows) {
    if (r.version == null) continue // the base model
    const name = r.model.split('@')[0]
    const acc = out.get(name)
    out.set(name, acc ? acc.map((v, i) => v + (r.spark[i] ?? 0)) : [...r.spark])
  }
  return out
}

export function Residency({ residency }: { residency: Record<string, number> }) {
  const tiers = tierCounts(residency)
  if (tiers.length === 0) return <Text c="dimmed" size="sm">not placed</Text>
  return (
    <Group gap={4} aria-label="Replicas per tier">
      {tiers.map((t) => (
        <TierBadge key={t.tier} tier={t.tier} count={t.count} />
      ))}
    </Group>
  )
}

export function Adapters() {
  const qc = useQueryClient()
  const { data: me } = useMe()
  const role = useRole(me)
  const adapters = useQuery({
    queryKey: ['adapters'],
    queryFn: async () => unwrap(await api.GET('/api/v1/adapters')),
    // Poll while any newest version is still being validated, so status changes without a reload.
    refetchInterval: (q) => (q.state.data?.some((a: Adapter) => a.latest_version && !isSettled(a.latest_version.status)) ? 1000 : 10_000),
  })
  const baseModels = useBaseModels()
  const traffic = useQuery({
    queryKey: ['usage-traffic-adapters'],
    queryFn: async () => unwrap(await api.GET('/api/v1/usage/traffic', { params: { query: { since: new Date(Date.now() - 3600e3).toISOString() } } })),
    refetchInterval: 30_000,
  })
  const sparks = sparksByAdapter(traffic.data ?? [])
  return (
    <Stack>
      <Title order={2}>Adapters</Title>
      <Table.ScrollContainer minWidth={640}>
        <Table striped highlightOnHover aria-label="Adapters">
          <Table.Thead>
            <Table.Tr>
              <Table.Th>Name</Table.Th>
              <Table.Th>Base model</Table.Th>
              <Table.Th>Newest version</Table.Th>
              <Table.Th>Serving</Table.Th>
              <Table.Th>Residency</Table.Th>
              <Table.Th>Traffic (1 h)</Table.Th>
            </Table.Tr>
          </Table.Thead>
          <Table.Tbody>
            {adapters.data?.map((a) => (
              <Table.Tr key={a.name}>
                <Table.Td>
                  <Anchor component={Link} to={`/adapters/${a.name}`}>
                    {a.name}
                  </Anchor>
                </Table.Td>
                <Table.Td>{a.base_model}</Table.Td>
                <Table.Td>
                  {a.latest_version ? (
                    <Group gap={6}>
                      <Text size="sm">v{a.latest_version.number}</Text>
                      <StatusBadge status={a.latest_version.status} />
                      <WarningsBadge report={a.latest_version.validation_report as Report | null} />
                    </Group>
                  ) : (
                    <Text c="dimmed">none</Text>
                  )}
                </Table.Td>
                <Table.Td>{a.serving_rule.length > 0 ? ruleText(a.serving_rule) : <Text c="dimmed">—</Text>}</Table.Td>
                <Table.Td>
                  <Residency residency={a.residency as Record<string, number>} />
                </Table.Td>
                <Table.Td>
                  <TrafficSparkline values={sparks.get(a.name) ?? []} label={`Requests of ${a.name} in the last hour`} />
                </Table.Td>
              </Table.Tr>
            ))}
          </Table.Tbody>
        </Table>
      </Table.ScrollContainer>
      {adapters.data?.length === 0 && <Text c="dimmed">No adapters yet: upload one below.</Text>}
      {role && role !== 'viewer' && baseModels.data && (
        <>
          <Title order={3}>Upload an adapter</Title>
          <UploadPanel baseModels={baseModels.data} onUploaded={() => qc.invalidateQueries({ queryKey: ['adapters'] })} />
        </>
      )}
    </Stack>
  )
}

/** A ready version's warnings would hide behind its READY badge (a fresh-user round: an untrained adapter read as
 * plain ready): their count beside it; the adapter's page shows the report. */
function WarningsBadge({ report }: { report: Report | null }) {
  const n = warningCount(report)
  if (n === 0) return null
  return <Badge color="yellow" variant="light" title="See the validation report on the adapter's page">{n === 1 ? '1 warning' : `${n} warnings`}</Badge>
}
