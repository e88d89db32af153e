import { Alert, Badge, Button, Card, Group, Modal, Progress, SimpleGrid, Stack, Table, Text, Title } from '@mantine/core'
import { useQuery, useQueryClient } from '@tanstack/react-query'
import { useState } from 'react'
import { api, unwrap } from '../api/client'

type Action = { kind: 'pin' | 'unpin' | 'evict'; node: string; placementId: number; versionId: number; label: string }

const TIER_COLOR: Record<string, string> = { hot: 'red', warm: 'orange', staged: 'yellow', cold: 'gray', errored: 'dark' }

export function Nodes() {
  const qc = useQueryClient()
  const [pending, setPending] = useState<Action | null>(null)
  const [message, setMessage] = useState<{ ok: boolean; text: string } | null>(null)
  const run = async (a: Action) => {
    setPending(null)
    const res =
      a.kind === 'evict'
        ? await api.POST('/api/v1/operator/placements/{id}/evict', { params: { path: { id: a.placementId } } })
        : await api.POST(a.kind === 'pin' ? '/api/v1/operator/versions/{id}/pin' : '/api/v1/operator/versions/{id}/unpin', {
            params: { path: { id: a.versionId } },
            body: { node: a.node },
          })
    const err = res.error as { detail?: string } | undefined
    setMessage(res.response.ok ? { ok: true, text: `${a.kind} ${a.label} on ${a.node}: requested; the next heartbeat shows it.` } : { ok: false, text: err?.detail ?? `HTTP ${res.response.status}` })
    void qc.invalidateQueries({ queryKey: ['operator-nodes'] })
    void qc.invalidateQueries({ queryKey: ['operator-audit'] })
  }
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
              <Table.Th>Actions</Table.Th>
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
                  <Table.Td>
                    <Group gap={4} wrap="nowrap">
                      {(['pin', 'unpin', 'evict'] as const)
                        .filter((k) => (k === 'pin' ? !p.pinned : k === 'unpin' ? p.pinned : !p.pinned))
                        .map((k) => (
                          <Button
                            key={k}
                            size="xs"
                            variant="light"
                            color={k === 'evict' ? 'red' : 'blue'}
                            aria-label={`${k} ${p.tenant}/${p.adapter} v${p.version} on ${n.name}`}
                            onClick={() => setPending({ kind: k, node: n.name, placementId: p.id, versionId: p.version_id, label: `${p.tenant}/${p.adapter} v${p.version}` })}
                          >
                            {k}
                          </Button>
                        ))}
                    </Group>
                  </Table.Td>
                </Table.Tr>
              )),
            )}
          </Table.Tbody>
        </Table>
      </Table.ScrollContainer>
    </Stack>
  )
}
