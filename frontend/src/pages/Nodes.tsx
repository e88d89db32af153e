// The fleet, a page of nodes at a time: each node's health, base model, LoRA slots and CPU cache used, its capacity
// as reported beside the operator's ceilings and the figure in force, its placements per tier, KV-cache pressure over time, running and waiting requests, preemptions and recent failures
// (GET /api/v1/operator/nodes?limit=&offset= and …/{name}/samples, polled).
import { Badge, Card, Group, Progress, SimpleGrid, Stack, Table, Text, Title } from '@mantine/core'
import { keepPreviousData, useQuery } from '@tanstack/react-query'
import { useState } from 'react'
import { api, unwrap, type Node } from '../api/client'
import { KvPressureChart } from '../components/KvPressureChart'
import { Pager } from '../components/Pager'
import { pageQuery, useClampedPage } from '../components/paging'
import { TierBadge, tierCounts } from '../components/tiers'
import { formatTime } from '../format'
import { capacityRows, slotFigures } from './nodeFigures'

/** Nodes per page: each card polls its own samples, so a page of 12 is about one samples call a second. */
export const NODES_PAGE = 12

function Figure({ label, value, note }: { label: string; value: string | number; note?: string }) {
  return (
    <div>
      <Text size="xs" c="dimmed">{label}</Text>
      <Text fw={600}>{value}</Text>
      {note && <Text size="xs" c="dimmed">{note}</Text>}
    </div>
  )
}

const show = (v: number | null) => (v == null ? '—' : v)

function CapacityTable({ n }: { n: Node }) {
  return (
    <Table withRowBorders={false} verticalSpacing={2} fz="xs" mt="sm" aria-label={`Capacity of ${n.name}`}>
      <Table.Thead>
        <Table.Tr>
          <Table.Th>Capacity</Table.Th>
          <Table.Th title="What the node's last heartbeat said its engine was started with">Reported</Table.Th>
          <Table.Th title="The most the control plane uses, whatever the node reports (quiver_node_register --max-loras …, else the fleet default)">Ceiling</Table.Th>
          <Table.Th title="What placement and routing use: the smaller of the two">In force</Table.Th>
        </Table.Tr>
      </Table.Thead>
      <Table.Tbody>
        {capacityRows(n).map((r) => (
          <Table.Tr key={r.label}>
            <Table.Td>{r.label}</Table.Td>
            <Table.Td>{show(r.reported)}</Table.Td>
            <Table.Td>{show(r.ceiling)}</Table.Td>
            <Table.Td>
              <Text span fw={600} fz="xs">{show(r.inForce)}</Text>{' '}
              <Text span c={r.source === 'ceiling, report clamped' ? 'orange' : 'dimmed'} fz="xs">({r.source})</Text>
            </Table.Td>
          </Table.Tr>
        ))}
      </Table.Tbody>
    </Table>
  )
}

function NodeCard({ n }: { n: Node }) {
  const since = new Date(Date.now() - 3600e3).toISOString()
  const samples = useQuery({
    queryKey: ['operator-node-samples', n.name],
    queryFn: async () => unwrap(await api.GET('/api/v1/operator/nodes/{name}/samples', { params: { path: { name: n.name }, query: { since } } })),
    refetchInterval: 10_000,
  })
  const kv = Math.round((n.kv_cache_usage_perc ?? 0) * 100)
  return (
    <Card withBorder aria-label={`Node ${n.name}`}>
      <Group justify="space-between">
        <Text fw={600}>{n.name}</Text>
        <Badge color={n.healthy ? 'green' : 'red'}>{n.healthy ? 'healthy' : 'down'}</Badge>
      </Group>
      <Text size="sm" c="dimmed">
        {n.base_model ?? 'no base model'} · last heartbeat {n.last_heartbeat_at ? formatTime(n.last_heartbeat_at) : 'never'}
      </Text>
      <SimpleGrid cols={{ base: 2, sm: 3 }} mt="sm" spacing="xs">
        {slotFigures(n).map((f) => <Figure key={f.label} label={f.label} value={f.value} note={f.note} />)}
        <Figure label="Running" value={n.num_requests_running ?? '—'} />
        <Figure label="Waiting" value={n.num_requests_waiting ?? '—'} />
        <Figure label="Preemptions" value={n.num_preemptions_total ?? '—'} />
        <Figure label="Failed (5 min)" value={n.failed_requests_5m ?? "—"} />
      </SimpleGrid>
      <CapacityTable n={n} />
      <Group gap={4} mt="sm" aria-label={`Placements on ${n.name}`}>
        {tierCounts(n.tiers).map((t) => <TierBadge key={t.tier} tier={t.tier} count={t.count} />)}
        {n.pinned > 0 && <Badge color="indigo" variant="outline" tt="none">{n.pinned} pinned</Badge>}
        {tierCounts(n.tiers).length === 0 && <Text size="xs" c="dimmed">no adapter placed</Text>}
      </Group>
      <Text size="sm" mt="sm">
        KV-cache pressure {kv} %
      </Text>
      <Progress value={kv} color={kv >= 90 ? 'red' : kv >= 80 ? 'orange' : 'blue'} aria-label={`KV-cache usage of ${n.name}`} />
      <Text size="xs" c="dimmed" mt="sm">Last hour</Text>
      <KvPressureChart node={n.name} samples={samples.data ?? []} />
    </Card>
  )
}

export function Nodes() {
  const [page, setPage] = useState(1)
  const nodes = useQuery({
    queryKey: ['operator-nodes', page],
    queryFn: async () => unwrap(await api.GET('/api/v1/operator/nodes', { params: { query: pageQuery(page, NODES_PAGE) } })),
    refetchInterval: 5000,
    placeholderData: keepPreviousData, // the old page stays up while the next one loads
  })
  useClampedPage(page, setPage, nodes.data?.count, NODES_PAGE)
  if (nodes.error) return <Text role="alert">{(nodes.error as Error).message}</Text>
  return (
    <Stack>
      <Title order={2}>Fleet</Title>
      {nodes.data?.count === 0 && <Text c="dimmed">No node has reported yet.</Text>}
      <Pager label="Pages of nodes" page={page} size={NODES_PAGE} count={nodes.data?.count ?? 0} onChange={setPage} />
      <SimpleGrid cols={{ base: 1, lg: 2 }}>
        {nodes.data?.results.map((n) => <NodeCard key={n.name} n={n} />)}
      </SimpleGrid>
    </Stack>
  )
}
