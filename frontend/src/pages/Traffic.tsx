// Per-adapter traffic of every tenant (operators): a page of GET /api/v1/operator/traffic over a chosen period,
// ordered by the API (every version's totals sort the table; percentiles come for the page's versions only).
import { Paper, SegmentedControl, Select, Stack, Title } from '@mantine/core'
import { keepPreviousData, useQuery } from '@tanstack/react-query'
import { useState } from 'react'
import { api, unwrap } from '../api/client'
import type { paths } from '../api/schema'
import { Pager } from '../components/Pager'
import { pageQuery, useClampedPage } from '../components/paging'
import { TrafficTable, type Sort } from '../components/TrafficTable'

export const PERIODS = [
  { label: 'Last hour', value: '1' },
  { label: '6 hours', value: '6' },
  { label: 'Last day', value: '24' },
]

/** Adapter versions per page of the table (the API's default page). */
export const TRAFFIC_PAGE = 50

type Ordering = NonNullable<NonNullable<paths['/api/v1/operator/traffic']['get']['parameters']['query']>['ordering']>

/** The API's `?ordering=` for a sort of the table (only the columns in SERVER_SORTABLE are ever asked for). */
const orderingOf = (sort: Sort): Ordering => `${sort.desc ? '-' : ''}${sort.key}` as Ordering

export function Traffic() {
  const [hours, setHours] = useState('1')
  const [tenant, setTenant] = useState<string | null>(null)
  const [sort, setSort] = useState<Sort>({ key: 'requests', desc: true })
  const [page, setPage] = useState(1)
  const tenants = useQuery({ queryKey: ['operator-tenants'], queryFn: async () => unwrap(await api.GET('/api/v1/operator/tenants')) })
  const traffic = useQuery({
    queryKey: ['operator-traffic', hours, tenant, orderingOf(sort), page],
    queryFn: async () => {
      const since = new Date(Date.now() - Number(hours) * 3600e3).toISOString()
      const query = { since, ordering: orderingOf(sort), ...pageQuery(page, TRAFFIC_PAGE), ...(tenant ? { tenant } : {}) }
      return unwrap(await api.GET('/api/v1/operator/traffic', { params: { query } }))
    },
    refetchInterval: 15_000,
    placeholderData: keepPreviousData, // the old page stays up while the next one loads
  })
  useClampedPage(page, setPage, traffic.data?.count, TRAFFIC_PAGE)
  // Another period, tenant or order is another list: back to its first page.
  const fresh = <T,>(set: (v: T) => void) => (v: T) => {
    set(v)
    setPage(1)
  }
  return (
    <Stack>
      <Title order={2}>Traffic</Title>
      <SegmentedControl aria-label="Period" value={hours} onChange={(v) => fresh(setHours)(String(v))} data={PERIODS} w="fit-content" />
      <Select label="Tenant" placeholder="All tenants" clearable w={240} value={tenant} onChange={(v) => fresh(setTenant)(v as string | null)}
        data={(tenants.data ?? []).map((t) => ({ value: t.slug, label: t.name }))} />
      <Pager label="Pages of adapter versions" page={page} size={TRAFFIC_PAGE} count={traffic.data?.count ?? 0} onChange={setPage} />
      <Paper withBorder p="md" radius="md">
        <TrafficTable rows={traffic.data?.results ?? []} showTenant sort={sort} onSort={fresh(setSort)} />
      </Paper>
    </Stack>
  )
}
