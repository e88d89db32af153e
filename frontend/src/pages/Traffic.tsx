// Per-adapter traffic of every tenant (operators): GET /api/v1/operator/traffic over a chosen period.
import { Paper, SegmentedControl, Select, Stack, Title } from '@mantine/core'
import { useQuery } from '@tanstack/react-query'
import { useState } from 'react'
import { api, unwrap } from '../api/client'
import { TrafficTable } from '../components/TrafficTable'

export const PERIODS = [
  { label: 'Last hour', value: '1' },
  { label: '6 hours', value: '6' },
  { label: 'Last day', value: '24' },
]

export function Traffic() {
  const [hours, setHours] = useState('1')
  const [tenant, setTenant] = useState<string | null>(null)
  const tenants = useQuery({ queryKey: ['operator-tenants'], queryFn: async () => unwrap(await api.GET('/api/v1/operator/tenants')) })
  const traffic = useQuery({
    queryKey: ['operator-traffic', hours, tenant],
    queryFn: async () => {
      const since = new Date(Date.now() - Number(hours) * 3600e3).toISOString()
      return unwrap(await api.GET('/api/v1/operator/traffic', { params: { query: { since, ...(tenant ? { tenant } : {}) } } }))
    },
    refetchInterval: 15_000,
  })
  return (
    <Stack>
      <Title order={2}>Traffic</Title>
      <SegmentedControl aria-label="Period" value={hours} onChange={(v) => setHours(String(v))} data={PERIODS} w="fit-content" />
      <Select label="Tenant" placeholder="All tenants" clearable w={240} value={tenant} onChange={(v) => setTenant(v as string | null)}
        data={(tenants.data ?? []).map((t) => ({ value: t.slug, label: t.name }))} />
      <Paper withBorder p="md" radius="md">
        <TrafficTable rows={traffic.data ?? []} showTenant />
      </Paper>
    </Stack>
  )
}
