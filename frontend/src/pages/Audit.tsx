import { Code, Stack, Table, Text, Title } from '@mantine/core'
import { useQuery } from '@tanstack/react-query'
import { api, unwrap } from '../api/client'
import { formatDateTime } from '../format'
import { tierLabel } from '../components/tiers'

/** An audit entry's before/after as JSON, with `tier` in the console's words (`CPU cache`, never `warm`): the
 * console promises one vocabulary for tiers, and the audit log showed the API's raw ones. */
export function auditJson(value: unknown): string {
  return JSON.stringify(value, (key, v) => (key === 'tier' && typeof v === 'string' ? tierLabel(v) : v))
}

/** Operator actions (pin, unpin, evict, replicas, quotas): who, what, when, before → after. */
export function Audit() {
  const audit = useQuery({ queryKey: ['operator-audit'], queryFn: async () => unwrap(await api.GET('/api/v1/operator/audit')), refetchInterval: 10_000 })
  return (
    <Stack>
      <Title order={2}>Audit log</Title>
      {audit.data?.length === 0 && <Text c="dimmed">No operator action yet.</Text>}
      <Table.ScrollContainer minWidth={720}>
        <Table striped aria-label="Audit log">
          <Table.Thead>
            <Table.Tr>
              <Table.Th>When</Table.Th>
              <Table.Th>Who</Table.Th>
              <Table.Th>Action</Table.Th>
              <Table.Th>Target</Table.Th>
              <Table.Th>Before → after</Table.Th>
            </Table.Tr>
          </Table.Thead>
          <Table.Tbody>
            {audit.data?.map((r) => (
              <Table.Tr key={r.id}>
                <Table.Td>{formatDateTime(r.created_at)}</Table.Td>
                <Table.Td>{r.actor}</Table.Td>
                <Table.Td>{r.action}</Table.Td>
                <Table.Td>{r.target}</Table.Td>
                <Table.Td>
                  <Code>{auditJson(r.before)}</Code> → <Code>{auditJson(r.after)}</Code>
                </Table.Td>
              </Table.Tr>
            ))}
          </Table.Tbody>
        </Table>
      </Table.ScrollContainer>
    </Stack>
  )
}
