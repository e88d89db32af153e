// Usage over time from GET /api/v1/usage/series: one line per model, a metric picked by the caller.
import { LineChart } from '@mantine/charts'
import { Text } from '@mantine/core'
import type { UsageSeriesRow } from '../api/client'
import { formatTime, modelLabel } from '../format'

export type Metric = 'requests' | 'completion_tokens' | 'prompt_tokens' | 'latency_ms_avg' | 'failures'

const PALETTE = ['indigo.6', 'teal.6', 'orange.6', 'grape.6', 'cyan.6', 'red.6', 'lime.6', 'pink.6']

/** Pivots rows `{t, model, <metric>}` into chart points `{t, [model]: value}`, oldest first. */
export function pivot(rows: UsageSeriesRow[], metric: Metric): { data: Record<string, string | number>[]; models: string[] } {
  const models = [...new Set(rows.map((r) => r.model))].sort()
  const byT = new Map<string, Record<string, string | number>>()
  for (const r of rows) {
    const label = formatTime(r.t, { seconds: false })
    const point = byT.get(r.t) ?? { t: label }
    point[r.model] = r[metric]
    byT.set(r.t, point)
  }
  const data = [...byT.entries()].sort(([a], [b]) => a.localeCompare(b)).map(([, p]) => p)
  for (const p of data) for (const m of models) p[m] ??= 0
  return { data, models }
}

/** One line per model, named in the legend as elsewhere (`name@3` → `name v3`, see `modelLabel`). */
export function usageSeries(models: string[]) {
  return models.map((m, i) => ({ name: m, label: modelLabel(m), color: PALETTE[i % PALETTE.length] }))
}

export function UsageChart({ rows, metric, label }: { rows: UsageSeriesRow[]; metric: Metric; label: string }) {
  if (rows.length === 0) return <Text c="dimmed">No traffic in this period.</Text>
  const { data, models } = pivot(rows, metric)
  return (
    <div role="img" aria-label={`${label} per model over time`}>
      <LineChart
        h={260}
        data={data}
        dataKey="t"
        withLegend
        series={usageSeries(models)}
        curveType="monotone"
      />
    </div>
  )
}
