// The validator's report (adapters_app/validation/report.py, schema 1): each problem's severity, code,
// field or tensor, message and fix hint, errors first.
import { Alert, Badge, Code, Stack, Table, Text } from '@mantine/core'

export interface Problem {
  code: string
  severity: 'error' | 'warning' | 'info' | string
  field: string | null
  message: string
  hint: string
}

export interface Report {
  schema?: number
  ok: boolean
  problems: Problem[]
  facts?: Record<string, unknown>
}

const ORDER: Record<string, number> = { error: 0, warning: 1, info: 2 }
const COLOR: Record<string, string> = { error: 'red', warning: 'yellow', info: 'blue' }

export function ValidationReport({ report }: { report: Report | null | undefined }) {
  if (!report) return <Text c="dimmed">Validation has not finished yet.</Text>
  const problems = [...(report.problems ?? [])].sort((a, b) => (ORDER[a.severity] ?? 3) - (ORDER[b.severity] ?? 3))
  return (
    <Stack gap="sm" aria-label="Validation report">
      <Alert color={report.ok ? 'green' : 'red'} title={report.ok ? 'Passed validation' : 'Rejected by validation'}>
        {problems.length === 0
          ? 'No problems found.'
          : `${problems.filter((p) => p.severity === 'error').length} error(s), ` +
            `${problems.filter((p) => p.severity !== 'error').length} other finding(s).`}
      </Alert>
      {problems.length > 0 && (
        <Table.ScrollContainer minWidth={560}>
          <Table striped aria-label="Problems">
            <Table.Thead>
              <Table.Tr>
                <Table.Th w={100}>Severity</Table.Th>
                <Table.Th>Code</Table.Th>
                <Table.Th>Field or tensor</Table.Th>
                <Table.Th>Problem and fix</Table.Th>
              </Table.Tr>
            </Table.Thead>
            <Table.Tbody>
              {problems.map((p, i) => (
                <Table.Tr key={`${p.code}-${i}`}>
                  <Table.Td>
                    <Badge color={COLOR[p.severity] ?? 'gray'} variant="light" style={{ overflow: 'visible' }}>
                      {p.severity}
                    </Badge>
                  </Table.Td>
                  <Table.Td>
                    <Code>{p.code}</Code>
                  </Table.Td>
                  <Table.Td>{p.field ? <Code>{p.field}</Code> : <Text c="dimmed">—</Text>}</Table.Td>
                  <Table.Td>
                    <Text size="sm">{p.message}</Text>
                    {p.hint && (
                      <Text size="sm" c="dimmed">
                        Fix: {p.hint}
                      </Text>
                    )}
                  </Table.Td>
                </Table.Tr>
              ))}
            </Table.Tbody>
          </Table>
        </Table.ScrollContainer>
      )}
    </Stack>
  )
}
