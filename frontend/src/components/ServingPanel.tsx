// Which versions `model = "<adapter>"` reaches, and how each did: promote, canary (slider), roll back, and the
// versions side by side over the last hour (docs/versions.md). Changes go through the API's promote / canary /
// rollback calls, which warm joining versions first and answer when the new rule serves.
import { Alert, Badge, Button, Group, Modal, NativeSelect, Slider, Stack, Table, Text, Title } from '@mantine/core'
import { useMutation, useQuery, useQueryClient } from '@tanstack/react-query'
import { useState } from 'react'
import { api, unwrap, type AdapterVersion, type Schemas } from '../api/client'
import { formatDateTime, formatTime } from '../format'
import { CHANGES_SHOWN, actorText, changesCount, canaryBlocked, promoteBlocked, rollbackText, ruleText, toEntries, warmText } from './serving'

type Serving = Schemas['ServingOutput']
type Figures = Schemas['VersionFigures']

const ms = (v: number | null | undefined) => (v == null ? '—' : `${Math.round(v)} ms`)
const pct = (v: number | null | undefined) => (v == null ? '—' : `${(v * 100).toFixed(1)} %`)

function outcome(body: Serving): string {
  const warm = Object.entries(body.warm ?? {})
    .map(([v, state]) => warmText(v, state))
    .join('; ')
  const since = body.serving_since ? ` since ${formatTime(body.serving_since)}` : ''
  return `Serving ${ruleText(body.rule)}${since}${warm ? ` (warmed first: ${warm})` : ''}.`
}

export function ServingPanel({ name, versions, canEdit }: { name: string; versions: AdapterVersion[]; canEdit: boolean }) {
  const qc = useQueryClient()
  const serving = useQuery({
    queryKey: ['adapters', name, 'serving'],
    queryFn: async () => unwrap(await api.GET('/api/v1/adapters/{name}/serving', { params: { path: { name } } })),
  })
  const figures = useQuery({
    queryKey: ['adapters', name, 'figures'],
    queryFn: async () =>
      unwrap(await api.GET('/api/v1/usage/versions', { params: { query: { adapter: name } } })),
    refetchInterval: 10_000,
  })
  const ready = versions.filter((v) => v.status === 'ready').map((v) => v.number)
  const rule = serving.data?.rule ?? []
  const primary = rule[0]?.version
  const [picked, setPicked] = useState<number | null>(null)
  const candidate = picked ?? ready.find((n) => n !== primary) ?? ready[0] ?? null
  const [percent, setPercent] = useState(10)
  // The only version, or the primary, cannot be canaried (the API answers 400): say why instead of the slider.
  const blocked = canaryBlocked(rule, candidate)
  const alreadyServes = promoteBlocked(rule, candidate)
  const [allChanges, setAllChanges] = useState(false)
  const [message, setMessage] = useState<{ ok: boolean; text: string } | null>(null)
  // Promote moves all traffic at once: asked first, as pin and evict are (a fresh user promoted by one click).
  const [confirming, setConfirming] = useState(false)

  const change = useMutation({
    mutationFn: async (kind: 'promote' | 'canary' | 'rollback') => {
      const path = { params: { path: { name } } }
      if (kind === 'rollback') return unwrap(await api.POST('/api/v1/adapters/{name}/rollback', path))
      if (candidate == null) throw new Error('No ready version to choose.')
      if (kind === 'promote')
        return unwrap(await api.POST('/api/v1/adapters/{name}/promote', { ...path, body: { version: candidate } }))
      return unwrap(
        await api.POST('/api/v1/adapters/{name}/canary', { ...path, body: { version: candidate, percent } }),
      )
    },
    onSuccess: (body) => {
      setMessage({ ok: true, text: outcome(body) })
      qc.setQueryData(['adapters', name, 'serving'], body)
      void qc.invalidateQueries({ queryKey: ['adapters', name] })
    },
    onError: (err: Error) => setMessage({ ok: false, text: err.message }),
  })

  return (
    <Stack gap="sm">
      <Modal opened={confirming} onClose={() => setConfirming(false)} title={`Send all of ${name}'s traffic to v${candidate}?`}>
        <Stack>
          <Text>
            Every request for <b>{name}</b> goes to v{candidate} once it is warm (now: {ruleText(rule)}). Roll back returns
            to the current rule at once.
          </Text>
          <Group>
            <Button onClick={() => { setConfirming(false); change.mutate('promote') }}>Promote v{candidate}</Button>
            <Button variant="default" onClick={() => setConfirming(false)}>
              Cancel
            </Button>
          </Group>
        </Stack>
      </Modal>
      <Title order={3}>Serving</Title>
      <Group gap="xs">
        <Text>
          <b>{name}</b> reaches:
        </Text>
        <Text data-testid="serving-rule">{ruleText(rule)}</Text>
        {serving.data?.auto_promote && <Badge variant="light">auto-promote</Badge>}
      </Group>
      {serving.data && (
        <Text size="sm" c="dimmed" data-testid="rollback-text">
          {rollbackText(serving.data.previous_rule) ?? 'Nothing to roll back to yet: no earlier serving rule.'}
        </Text>
      )}
      {canEdit && ready.length > 0 && (
        <Stack gap="xs" maw={560}>
          <Group align="end" wrap="wrap">
            <NativeSelect
              label="Version"
              data={ready.map((n) => ({ value: String(n), label: `v${n}` }))}
              value={candidate == null ? '' : String(candidate)}
              onChange={(e) => setPicked(Number(e.currentTarget.value))}
            />
            <Button
              onClick={() => setConfirming(true)}
              disabled={!!alreadyServes}
              title={alreadyServes ?? undefined}
              loading={change.isPending && change.variables === 'promote'}
            >
              Promote
            </Button>
            <Button
              variant="light"
              color="orange"
              disabled={!rollbackText(serving.data?.previous_rule)}
              onClick={() => change.mutate('rollback')}
              loading={change.isPending && change.variables === 'rollback'}
            >
              Roll back
            </Button>
          </Group>
          {alreadyServes && (
            <Text size="sm" c="dimmed" data-testid="promote-blocked">
              Nothing to promote: {alreadyServes} Pick another ready version to promote it.
            </Text>
          )}
          {blocked ? (
            <Text size="sm" c="dimmed" data-testid="canary-blocked">
              No canary for v{candidate}: {blocked}
            </Text>
          ) : (
            <>
              <Text size="sm" id="canary-label">
                Canary share for v{candidate}: <b data-testid="canary-percent">{percent} %</b>
              </Text>
              <Slider
                aria-labelledby="canary-label"
                thumbLabel="Canary share"
                min={0}
                max={50}
                step={1}
                value={percent}
                onChange={setPercent}
                marks={[{ value: 0 }, { value: 10 }, { value: 25 }, { value: 50 }]}
              />
              <Group>
                <Button variant="default" onClick={() => change.mutate('canary')} loading={change.isPending && change.variables === 'canary'}>
                  Apply canary
                </Button>
              </Group>
            </>
          )}
        </Stack>
      )}
      {message && (
        <Alert role="status" color={message.ok ? 'teal' : 'red'} data-testid="serving-message">
          {message.text}
        </Alert>
      )}
      <Title order={4}>Versions side by side (last hour)</Title>
      <Table.ScrollContainer minWidth={720}>
        <Table striped aria-label="Versions side by side">
          <Table.Thead>
            <Table.Tr>
              <Table.Th>Version</Table.Th>
              <Table.Th>Share</Table.Th>
              <Table.Th>Requests</Table.Th>
              <Table.Th>Errors</Table.Th>
              <Table.Th>TTFT p50</Table.Th>
              <Table.Th>TTFT p95</Table.Th>
              <Table.Th>Latency p50</Table.Th>
              <Table.Th>Latency p95</Table.Th>
              <Table.Th>Tokens in / out</Table.Th>
            </Table.Tr>
          </Table.Thead>
          <Table.Tbody>
            {(figures.data ?? []).map((f: Figures) => (
              <Table.Tr key={f.version} data-testid={`figures-${f.version}`}>
                <Table.Td>v{f.version}</Table.Td>
                <Table.Td>{f.in_rule ? `${f.weight} %` : 'draining / pinned only'}</Table.Td>
                <Table.Td>{f.requests}</Table.Td>
                <Table.Td>
                  {f.errors} ({pct(f.error_rate)})
                </Table.Td>
                <Table.Td>{ms(f.ttft_ms_p50)}</Table.Td>
                <Table.Td>{ms(f.ttft_ms_p95)}</Table.Td>
                <Table.Td>{ms(f.latency_ms_p50)}</Table.Td>
                <Table.Td>{ms(f.latency_ms_p95)}</Table.Td>
                <Table.Td>
                  {f.prompt_tokens} / {f.completion_tokens}
                </Table.Td>
              </Table.Tr>
            ))}
          </Table.Tbody>
        </Table>
      </Table.ScrollContainer>
      {serving.data && serving.data.history.length > 0 && (
        <Stack gap={2}>
          <Group gap="xs" align="baseline">
            <Title order={4}>Changes</Title>
            <Text size="sm" c="dimmed" data-testid="changes-count">
              {changesCount(serving.data.history.length, allChanges)}
            </Text>
          </Group>
          {(allChanges ? serving.data.history : serving.data.history.slice(0, CHANGES_SHOWN)).map((h, i) => (
            <Text size="sm" key={i} data-testid="serving-change">
              {formatDateTime(h.created_at)} · {actorText(h)} · {h.action}
              {h.action !== 'settings' &&
                ` · ${ruleText(toEntries(h.before))} → ${ruleText(toEntries(h.after))}`}
            </Text>
          ))}
          {serving.data.history.length > CHANGES_SHOWN && (
            <Group>
              <Button size="compact-sm" variant="subtle" onClick={() => setAllChanges((v) => !v)}>
                {allChanges ? `Show the latest ${CHANGES_SHOWN}` : `Show all ${serving.data.history.length} changes`}
              </Button>
            </Group>
          )}
        </Stack>
      )}
    </Stack>
  )
}
