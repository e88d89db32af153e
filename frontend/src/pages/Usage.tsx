import { Paper, SegmentedControl, Stack, Table, Title } from '@mantine/core'
import { useQuery } from '@tanstack/react-query'
import { useState } from 'react'
import { api, unwrap, type Schemas } from '../api/client'
import { TrafficTable } from '../components/TrafficTable'
import { UsageChart } from '../components/UsageChart'
import type { Metric } from '../components/usageSeries'
import { versionLabel } from '../format'

const METRICS: { value: Metric; label: string }[] = [
  { value: 'requests', label: 'Requests' },
  { value: 'completion_tokens', label: 'Completion tokens' },
  { value: 'prompt_tokens', label: 'Prompt tokens' },
  { value: 'latency_ms_avg', label: 'Latency (ms)' },
  { value: 'failures', label: 'Errors' },
]

export type UsageTotal = { label: string; requests: number; prompt_tokens: number; completion_tokens: number }

/** Token totals per adapter version, named as everywhere else (`capitals v3`): a version reached both as `capitals`
 * and as `capitals@3` is one row. Order kept (the API sorts by model, version). */
export function usageTotals(rows: Schemas['UsageRow'][]): UsageTotal[] {
  const out = new Map<string, UsageTotal>()
  for (const r of rows) {
    const label = versionLabel(r.model, r.version)
    const t = out.get(label) ?? { label, requests: 0, prompt_tokens: 0, completion_tokens: 0 }
    t.requests += r.requests
    t.prompt_tokens += r.prompt_tokens
    t.completion_tokens += r.completion_tokens
    out.set(label, t)
  }
  return [...out.values()]
}

export function Usage() {
  const [metric, setMetric] = useState<Metric>('requests')
  const [range, setRange] = useState('1h')
  const since = new Date(Date.now() - (range === '1h' ? 3600e3 : 86400e3)).toISOString()
  const bucket = range === '1h' ? 'minute' : 'hour'
  const series = useQuery({
    queryKey: ['usage-series', range],
    queryFn: async () => unwrap(await api.GET('/api/v1/usage/series', { params: { query: { since, bucket } } })),
    refetchInterval: 15_000,
  })
  const traffic = useQuery({
    queryKey: ['usage-traffic', range],
    queryFn: async () => unwrap(await api.GET('/api/v1/usage/traffic', { params: { query: { since } } })),
    refetchInterval: 15_000,
  })
  const totals = useQuery({ queryKey: ['usage'], queryFn: async () => unwrap(await api.GET('/api/v1/usage')) })
  const label = METRICS.find((m) => m.value === metric)!.label
  return (
    <Stack>
      <Title order={2}>Usage</Title>
      <SegmentedControl aria-label="Time range" value={range} onChange={(v) => setRange(String(v))} data={[{ label: 'Last hour', value: '1h' }, { label: 'Last day', value: '1d' }]} w="fit-content" />
      <SegmentedControl aria-label="Metric" value={metric} onChange={(v) => setMetric(v as Metric)} data={METRICS} style={{ flexWrap: 'wrap' }} />
      <Paper withBorder p="md" radius="md">
        <UsageChart rows={series.data ?? []} metric={metric} label={label} />
      </Paper>
      <Title order={3}>Per adapter</Title>
      <Paper withBorder p="md" radius="md">
        <TrafficTable rows={traffic.data ?? []} />
      </Paper>
      <Title order={3}>Totals</Title>
      <Table.ScrollContainer minWidth={480}>
        <Table striped aria-label="Usage totals">
          <Table.Thead>
            <Table.Tr>
              <Table.Th>Model</Table.Th>
              <Table.Th>Requests</Table.Th>
              <Table.Th>Prompt tokens</Table.Th>
              <Table.Th>Completion tokens</Table.Th>
            </Table.Tr>
          </Table.Thead>
          <Table.Tbody>
            {usageTotals(totals.data ?? []).map((r) => (
              <Table.Tr key={r.label}>
                <Table.Td>{r.label}</Table.Td>
                <Table.Td>{r.requests}</Table.Td>
                <Table.Td>{r.prompt_tokens}</Table.Td>
                <Table.Td>{r.completion_tokens}</Table.Td>
              </Table.Tr>
            ))}
          </Table.Tbody>
        </Table>
      </Table.ScrollContainer>
    </Stack>
  )
}
