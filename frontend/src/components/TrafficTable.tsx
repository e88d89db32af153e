// Per-adapter traffic over a period (GET /api/v1/usage/traffic or /api/v1/operator/traffic): requests, rates,
// tokens, errors, latency and TTFT percentiles, sortable, with a request sparkline per row. A tenant's table is whole
// and sorted here; the operator's is a page of every tenant's, sorted by the API (`sort` and `onSort` given).
import { Sparkline } from '@mantine/charts'
import { Table, Text, UnstyledButton } from '@mantine/core'
import { useState } from 'react'
import type { TrafficRow } from '../api/client'
import { formatRate, versionLabel } from '../format'

export type SortKey = 'tenant' | 'model' | 'requests' | 'tokens_per_s' | 'failures' | 'latency_ms_p50' | 'latency_ms_p95' | 'ttft_ms_p50'
export type Sort = { key: SortKey; desc: boolean }

/** Columns the API can order a paged table by (`?ordering=`): every version's totals carry them; percentiles are
 * computed for the page's versions only, so a page cannot be ordered by them. */
export const SERVER_SORTABLE = new Set<SortKey>(['tenant', 'model', 'requests', 'tokens_per_s', 'failures'])
export const UNSORTABLE_HELP = 'Computed for the versions on this page only, so the table cannot be ordered by it.'

/** TTFT comes only from streamed requests (a non-streamed answer arrives whole), so a period without one has none. */
export const TTFT_HELP = 'Time to first token: measured on streamed requests only. — means no streamed request in this period.'
export const NO_TTFT = 'No streamed request in this period: TTFT is measured on streamed requests only.'

const COLUMNS: { key: SortKey; label: string; help?: string }[] = [
  { key: 'model', label: 'Model' },
  { key: 'requests', label: 'Requests' },
  { key: 'tokens_per_s', label: 'Token rate', help: 'Tokens (prompt and completion) per second, minute or hour over the period.' },
  { key: 'failures', label: 'Errors' },
  { key: 'latency_ms_p50', label: 'p50 ms' },
  { key: 'latency_ms_p95', label: 'p95 ms' },
  { key: 'ttft_ms_p50', label: 'TTFT p50 ms', help: TTFT_HELP },
]

/** Sorted copy; numbers descending by default, names ascending; nulls last either way. */
export function sortRows(rows: TrafficRow[], key: SortKey, desc: boolean): TrafficRow[] {
  const value = (r: TrafficRow) => (key === 'model' ? `${r.tenant}/${r.model}` : r[key])
  return [...rows].sort((a, b) => {
    const va = value(a)
    const vb = value(b)
    if (va == null) return vb == null ? 0 : 1
    if (vb == null) return -1
    const cmp = typeof va === 'string' ? va.localeCompare(String(vb)) : (va as number) - (vb as number)
    return desc ? -cmp : cmp
  })
}

export const fmtMs = (v: number | null | undefined) => (v == null ? '—' : v < 10 ? v.toFixed(1) : Math.round(v).toString())

export function TrafficSparkline({ values, label }: { values: number[]; label: string }) {
  return (
    <div role="img" aria-label={`${label}: ${values.reduce((a, b) => a + b, 0)} requests`} style={{ width: 96 }}>
      <Sparkline w={96} h={24} data={values.length ? values : [0]} curveType="linear" color="indigo.6" fillOpacity={0.3} strokeWidth={1.5} />
    </div>
  )
}

/** The sort after a click on `key`'s header: the other direction of the same column; numbers most first, names A–Z. */
const nextSort = (s: Sort, key: SortKey): Sort => (s.key === key ? { key, desc: !s.desc } : { key, desc: key !== 'model' && key !== 'tenant' })

/**
 * The table. Without `onSort` it sorts `rows` itself (a click re-sorts); with `sort` and `onSort` the rows are a page
 * the API ordered by `sort`, shown in their order, and a click on a column the API can order by asks for another
 * order; the percentile columns are not sortable then (see SERVER_SORTABLE).
 */
export function TrafficTable({ rows, showTenant, sort: paged, onSort }: {
  rows: TrafficRow[]
  showTenant?: boolean
  sort?: Sort
  onSort?: (sort: Sort) => void
}) {
  const [local, setLocal] = useState<Sort>({ key: 'requests', desc: true })
  if (rows.length === 0) return <Text c="dimmed">No traffic in this period.</Text>
  const server = onSort != null
  const sort = server && paged ? paged : local
  const sorted = server ? rows : sortRows(rows, sort.key, sort.desc)
  const click = (key: SortKey) => (server ? onSort(nextSort(sort, key)) : setLocal((s) => nextSort(s, key)))
  const header = (c: { key: SortKey; label: string; help?: string }) => {
    if (server && !SERVER_SORTABLE.has(c.key)) {
      return (
        <Table.Th key={c.key} title={[c.help, UNSORTABLE_HELP].filter(Boolean).join(' ')}>
          {c.label}
        </Table.Th>
      )
    }
    return (
      <Table.Th key={c.key} aria-sort={sort.key === c.key ? (sort.desc ? 'descending' : 'ascending') : 'none'}>
        <UnstyledButton onClick={() => click(c.key)} fw={600} fz="sm" title={c.help}>
          {c.label} {sort.key === c.key ? (sort.desc ? '↓' : '↑') : ''}
        </UnstyledButton>
      </Table.Th>
    )
  }
  return (
    <>
      <Table.ScrollContainer minWidth={760}>
        <Table striped aria-label="Traffic per adapter">
          <Table.Thead>
            <Table.Tr>
              {showTenant && (server ? header({ key: 'tenant', label: 'Tenant' }) : <Table.Th>Tenant</Table.Th>)}
              {COLUMNS.map(header)}
              <Table.Th>Trend</Table.Th>
            </Table.Tr>
          </Table.Thead>
          <Table.Tbody>
            {sorted.map((r) => {
              const name = versionLabel(r.model, r.version)
              return (
                <Table.Tr key={`${r.tenant}-${r.model}-${r.version}`} data-testid={`traffic-${r.tenant}-${r.model}`}>
                  {showTenant && <Table.Td>{r.tenant}</Table.Td>}
                  <Table.Td>{name}</Table.Td>
                  <Table.Td>
                    {r.requests} <Text span c="dimmed" size="xs">({formatRate(r.requests_per_s)})</Text>
                  </Table.Td>
                  <Table.Td>{formatRate(r.tokens_per_s)}</Table.Td>
                  <Table.Td c={r.failures > 0 ? 'red' : undefined}>{r.failures}</Table.Td>
                  <Table.Td>{fmtMs(r.latency_ms_p50)}</Table.Td>
                  <Table.Td>{fmtMs(r.latency_ms_p95)}</Table.Td>
                  <Table.Td title={r.ttft_ms_p50 == null ? NO_TTFT : undefined}>{fmtMs(r.ttft_ms_p50)}</Table.Td>
                  <Table.Td>
                    <TrafficSparkline values={r.spark} label={`Requests of ${name} over time`} />
                  </Table.Td>
                </Table.Tr>
              )
            })}
          </Table.Tbody>
        </Table>
      </Table.ScrollContainer>
      {rows.some((r) => r.ttft_ms_p50 == null) && (
        <Text size="xs" c="dimmed" mt="xs">
          {TTFT_HELP}
        </Text>
      )}
    </>
  )
}
