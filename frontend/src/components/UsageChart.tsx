// Usage over time from GET /api/v1/usage/series: one line per model, a metric picked by the caller.
import { LineChart } from '@mantine/charts'
import { Text } from '@mantine/core'
import type { UsageSeriesRow } from '../api/client'
import { groupModels, pivot, usageSeries, type Metric } from './usageSeries'

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
        series={usageSeries(models, groupModels(rows).other.length)}
        // Recharts sorts legend items by label, which put "other" first; keep pivot's order (by name, other last).
        legendProps={{ itemSorter: (item) => models.indexOf(String(item.dataKey)) }}
        curveType="monotone"
      />
    </div>
  )
}
