import { Anchor, Button, Code, Group, Stack, Table, Text, Title } from '@mantine/core'
import { useQuery, useQueryClient } from '@tanstack/react-query'
import { useState } from 'react'
import { Link, useParams } from 'react-router'
import { api, unwrap, type AdapterVersion } from '../api/client'
import { useMe, useRole } from '../auth'
import { StatusBadge, isSettled } from '../components/StatusBadge'
import { ServingPanel } from '../components/ServingPanel'
import { ruleText } from '../components/serving'
import { UploadPanel } from '../components/UploadPanel'
import { ValidationReport, type Report } from '../components/ValidationReport'
import { Residency } from './Adapters'

const size = (n: number) => (n >= 1 << 20 ? `${(n / (1 << 20)).toFixed(1)} MiB` : `${(n / 1024).toFixed(1)} KiB`)

export function AdapterDetail() {
  const { name = '' } = useParams()
  const qc = useQueryClient()
  const { data: me } = useMe()
  const role = useRole(me)
  const [open, setOpen] = useState<number | null>(null)
  const adapter = useQuery({
    queryKey: ['adapters', name],
    queryFn: async () => unwrap(await api.GET('/api/v1/adapters/{name}', { params: { path: { name } } })),
  })
  const versions = useQuery({
    queryKey: ['adapters', name, 'versions'],
    queryFn: async () =>
      unwrap(await api.GET('/api/v1/adapters/{adapter_name}/versions', { params: { path: { adapter_name: name } } })),
    refetchInterval: (q) => (q.state.data?.some((v: AdapterVersion) => !isSettled(v.status)) ? 1000 : false),
  })
  if (adapter.error) return <Text role="alert">Adapter {name} not found.</Text>
  const shown = versions.data?.find((v) => v.number === open)
  return (
    <Stack>
      <Anchor component={Link} to="/adapters" size="sm">
        ← Adapters
      </Anchor>
      <Title order={2}>{name}</Title>
      {adapter.data && (
        <Group gap="lg">
          <Text>
            Base model <Code>{adapter.data.base_model}</Code>
          </Text>
          <Text>Serving: {ruleText(adapter.data.serving_rule)}</Text>
          <Residency residency={adapter.data.residency as Record<string, number>} />
        </Group>
      )}
      {versions.data && (
        <ServingPanel name={name} versions={versions.data} canEdit={!!role && role !== 'viewer'} />
      )}
      <Title order={3}>Versions</Title>
      <Table.ScrollContainer minWidth={640}>
        <Table striped aria-label="Versions">
          <Table.Thead>
            <Table.Tr>
              <Table.Th>Version</Table.Th>
              <Table.Th>Status</Table.Th>
              <Table.Th>r / lora_alpha</Table.Th>
              <Table.Th>Size</Table.Th>
              <Table.Th>sha256</Table.Th>
              <Table.Th>Report</Table.Th>
            </Table.Tr>
          </Table.Thead>
          <Table.Tbody>
            {versions.data?.map((v) => (
              <Table.Tr key={v.number} data-testid={`version-${v.number}`}>
                <Table.Td>v{v.number}</Table.Td>
                <Table.Td>
                  <StatusBadge status={v.status} />
                </Table.Td>
                <Table.Td>{v.r != null ? `${v.r} / ${v.lora_alpha}` : '—'}</Table.Td>
                <Table.Td>{size(v.size_bytes)}</Table.Td>
                <Table.Td>
                  <Code>{v.sha256.slice(0, 12)}…</Code>
                </Table.Td>
                <Table.Td>
                  <Button size="xs" variant="light" onClick={() => setOpen(open === v.number ? null : v.number)} aria-expanded={open === v.number}>
                    {open === v.number ? 'Hide report' : 'Show report'}
                  </Button>
                </Table.Td>
              </Table.Tr>
            ))}
          </Table.Tbody>
        </Table>
      </Table.ScrollContainer>
      {shown && (
        <Stack gap="xs">
          <Title order={4}>Validation report of v{shown.number}</Title>
          <ValidationReport report={shown.validation_report as Report | null} />
        </Stack>
      )}
      {role && role !== 'viewer' && adapter.data && (
        <>
          <Title order={3}>Upload a new version</Title>
          <UploadPanel
            baseModels={[adapter.data.base_model]}
            defaultAdapter={name}
            lockAdapter
            onUploaded={(v) => {
              setOpen(v.number)
              void qc.invalidateQueries({ queryKey: ['adapters'] })
            }}
          />
        </>
      )}
    </Stack>
  )
}
