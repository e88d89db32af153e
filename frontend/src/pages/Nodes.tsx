import { Badge, Card, Group, Progress, SimpleGrid, Stack, Table, Text, Title } from '@mantine/core'
import { useQuery } from '@tanstack/react-query'
import { api, unwrap } from '../api/client'

const TIER_COLOR: Record<string, string> = { hot: 'red', warm: 'orange', staged: 'yellow', cold: 'gray', errored: 'dark' }

export function Nodes() {
  const nodes = useQuery({ queryKey: ['operator-nodes'], queryFn: async () => unwrap(await api.GET('/api/v1/operator/nodes')), refetchInterval: 5000 })
  if (nodes.error) return <Text role="alert">{(nodes.error as Error).message}</Text>
  return (
    <Stack>
      <Title order={2}>Nodes and residency</Title>
      {nodes.data?.length === 0 && <Text c="dimmed">No node has reported yet.</Text>}
      <SimpleGrid cols={{ base: 1, md: 2 }}>
        {nodes.data?.map((n) => {
          const kv = Math.round((n.kv_cache_usage_perc ?? 0) * 100)
          const hot = n.placements.filter((p) => p.tier === 'hot').length
          const warm = n.placements.filter((p) => p.tier === 'warm').length
          return (
            <Card withBorder key={n.name} aria-label={`Node ${n.name}`}>
              <Group justify="space-between">
                <Text fw={600}>{n.name}</Text>
                <Badge color={n.healthy ? 'green' : 'red'}>{n.healthy ? 'healthy' : 'down'}</Badge>
              </Group>
              <Text size="sm" c="dimmed">
                {n.base_model ?? 'no base model'} · last heartbeat {n.last_heartbeat_at ? new Date(n.last_heartbeat_at).toLocaleTimeString() : 'never'}
              </Text>
              <Text size="sm" mt="xs">
                GPU slots {hot}/{n.max_loras} · CPU slots {warm}/{n.max_cpu_loras} · running {n.num_requests_running ?? '—'} · waiting{' '}
                {n.num_requests_waiting ?? '—'}
              </Text>
              <Text size="sm" mt="xs">
                KV-cache pressure {kv} %
              </Text>
              <Progress value={kv} color={kv >= 90 ? 'red' : kv >= 80 ? 'orange' : 'blue'} aria-label={`KV-cache usage of ${n.name}`} />
            </Card>
          )
        })}
      </SimpleGrid>
      <Title order={3}>Placements</Title>
      <Table.ScrollContainer minWidth={640}>
        <Table striped aria-label="Placements">
          <Table.Thead>
            <Table.Tr>
              <Table.Th>Node</Table.Th>
              <Table.Th>Tenant</Table.Th>
              <Table.Th>Adapter</Table.Th>
              <Table.Th>Tier</Table.Th>
              <Table.Th>Pinned</Table.Th>
              <Table.Th>Size</Table.Th>
              <Table.Th>Load time</Table.Th>
            </Table.Tr>
          </Table.Thead>
          <Table.Tbody>
            {nodes.data?.flatMap((n) =>
              n.placements.map((p) => (
                <Table.Tr key={`${n.name}-${p.tenant}-${p.adapter}-${p.version}`}>
                  <Table.Td>{n.name}</Table.Td>
                  <Table.Td>{p.tenant}</Table.Td>
                  <Table.Td>
                    {p.adapter} v{p.version}
                  </Table.Td>
                  <Table.Td>
                    <Badge color={TIER_COLOR[p.tier] ?? 'gray'} variant="light">
                      {p.tier}
                    </Badge>
                  </Table.Td>
                  <Table.Td>{p.pinned ? 'yes' : 'no'}</Table.Td>
                  <Table.Td>{(p.size_bytes / 1024).toFixed(0)} KiB</Table.Td>
                  <Table.Td>{p.load_ms != null ? `${p.load_ms.toFixed(0)} ms` : '—'}</Table.Td>
                </Table.Tr>
              )),
            )}
          </Table.Tbody>
        </Table>
      </Table.ScrollContainer>
    </Stack>
  )
}
