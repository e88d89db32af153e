// Tenants and quotas (operators): each tenant's gateway limits (RPM, TPM, concurrency, max_tokens; enforced by the
// gateway in Redis within a second of saving) and residency quota (pins, GPU bytes). Both edits are audited.
import { Alert, Button, Card, Group, NumberInput, Select, SimpleGrid, Stack, Text, Title } from '@mantine/core'
import { useQuery, useQueryClient } from '@tanstack/react-query'
import { useState } from 'react'
import { api, currentTenant, unwrap, type OperatorTenant } from '../api/client'

const LIMITS = [
  { key: 'rpm_limit', label: 'Requests per minute (RPM)' },
  { key: 'tpm_limit', label: 'Tokens per minute (TPM)' },
  { key: 'concurrency_limit', label: 'Concurrent requests' },
  { key: 'max_tokens_limit', label: 'Max tokens per request' },
] as const
type LimitKey = (typeof LIMITS)[number]['key']
type Values = Record<string, number | string>

const toNull = (v: number | string | undefined) => (v === '' || v == null ? null : Number(v))
const MIB = 1024 * 1024

function TenantForms({ tenant, onSaved }: { tenant: OperatorTenant; onSaved: (ok: boolean, text: string) => void }) {
  const [limits, setLimits] = useState<Values>(Object.fromEntries(LIMITS.map((l) => [l.key, tenant.limits[l.key] ?? ''])))
  const [priority, setPriority] = useState<string | null>(tenant.limits.priority_class ?? null)
  const [pins, setPins] = useState<number | string>(tenant.residency_quota.max_pinned ?? '')
  const [gpuMib, setGpuMib] = useState<number | string>(tenant.residency_quota.max_gpu_bytes != null ? tenant.residency_quota.max_gpu_bytes / MIB : '')
  const saveLimits = async () => {
    const body = { ...(Object.fromEntries(LIMITS.map((l) => [l.key, toNull(limits[l.key])])) as Record<LimitKey, number | null>), priority_class: priority as 'high' | 'normal' | 'low' | null }
    const res = await api.PATCH('/api/v1/operator/tenants/{slug}/limits', { params: { path: { slug: tenant.slug } }, body })
    const err = res.error as { detail?: string } | undefined
    onSaved(res.response.ok, res.response.ok ? `Limits of ${tenant.slug} saved; the gateway applies them within a second.` : err?.detail ?? `HTTP ${res.response.status}`)
  }
  const saveQuota = async () => {
    const gpu = toNull(gpuMib)
    const res = await api.PUT('/api/v1/operator/residency-quotas/{slug}', {
      params: { path: { slug: tenant.slug } },
      body: { max_pinned: toNull(pins), max_gpu_bytes: gpu == null ? null : Math.round(gpu * MIB) },
    })
    const err = res.error as { detail?: string } | undefined
    onSaved(res.response.ok, res.response.ok ? `Residency quota of ${tenant.slug} saved.` : err?.detail ?? `HTTP ${res.response.status}`)
  }
  return (
    <SimpleGrid cols={{ base: 1, md: 2 }}>
      <Card withBorder component="form" aria-label={`Gateway limits of ${tenant.slug}`} onSubmit={(e) => { e.preventDefault(); void saveLimits() }}>
        <Title order={3} size="h4" mb="xs">Gateway limits</Title>
        <Stack gap="xs">
          {LIMITS.map((l) => (
            <NumberInput key={l.key} label={l.label} description="Empty: unlimited" min={1} allowDecimal={false}
              value={limits[l.key]} onChange={(v) => setLimits((s) => ({ ...s, [l.key]: v }))} />
          ))}
          <Select label="Priority class" description="Order under saturation; empty: normal" clearable data={['high', 'normal', 'low']}
            value={priority} onChange={(v) => setPriority(v as string | null)} comboboxProps={{ withinPortal: true }} />
          <Group><Button type="submit">Save limits</Button></Group>
        </Stack>
      </Card>
      <Card withBorder component="form" aria-label={`Residency quota of ${tenant.slug}`} onSubmit={(e) => { e.preventDefault(); void saveQuota() }}>
        <Title order={3} size="h4" mb="xs">Residency quota</Title>
        <Stack gap="xs">
          <NumberInput label="Pinned versions" description="Empty: no limit" min={0} allowDecimal={false} value={pins} onChange={(v) => setPins(v as number | string)} />
          <NumberInput label="GPU slot memory (MiB)" description="Rank-padded slot bytes; over it, this tenant's adapters are evicted first. Empty: no limit" min={0} value={gpuMib} onChange={(v) => setGpuMib(v as number | string)} />
          <Group><Button type="submit">Save quota</Button></Group>
        </Stack>
      </Card>
    </SimpleGrid>
  )
}

/** The tenant the page opens on: the one the console acts in when listed, else the first. Without it the page opened
 * on an empty picker and no form, even with a single tenant. */
export function initialTenant(tenants: { slug: string }[], current: string | null): string | null {
  return tenants.find((t) => t.slug === current)?.slug ?? tenants[0]?.slug ?? null
}

export function Tenants() {
  const qc = useQueryClient()
  const tenants = useQuery({ queryKey: ['operator-tenants'], queryFn: async () => unwrap(await api.GET('/api/v1/operator/tenants')) })
  const [picked, setSlug] = useState<string | null>(null)
  const [message, setMessage] = useState<{ ok: boolean; text: string } | null>(null)
  const slug = picked ?? initialTenant(tenants.data ?? [], currentTenant())
  const chosen = tenants.data?.find((t) => t.slug === slug)
  if (tenants.error) return <Text role="alert">{(tenants.error as Error).message}</Text>
  if (!tenants.data) return <Stack><Title order={2}>Tenants and quotas</Title><Text c="dimmed">Loading tenants…</Text></Stack>
  return (
    <Stack>
      <Title order={2}>Tenants and quotas</Title>
      {tenants.data.length === 0 && <Text c="dimmed">No tenants yet: create one with <code>manage.py quiver_tenant_create &lt;slug&gt;</code>.</Text>}
      <Select label="Tenant to edit" placeholder="Pick a tenant" searchable data={tenants.data.map((t) => ({ value: t.slug, label: `${t.name} (${t.slug})` }))}
        value={slug} onChange={(v) => { setSlug(v); setMessage(null) }} w={{ base: '100%', sm: 320 }} />
      {message && (
        <Alert color={message.ok ? 'green' : 'red'} role="status" withCloseButton onClose={() => setMessage(null)}>{message.text}</Alert>
      )}
      {chosen && (
        <TenantForms key={chosen.slug} tenant={chosen} onSaved={(ok, text) => {
          setMessage({ ok, text })
          void qc.invalidateQueries({ queryKey: ['operator-tenants'] })
          void qc.invalidateQueries({ queryKey: ['operator-audit'] })
        }} />
      )}
      <Text size="sm" c="dimmed">
        {tenants.data.length} {tenants.data.length === 1 ? 'tenant' : 'tenants'}. Per-key limits are set on each tenant's keys (on the console's API keys page or the API) by its owners, and by members on their own keys, never looser than what binds them; the tighter limit applies.
      </Text>
    </Stack>
  )
}
