import { Alert, Button, Grid, Group, NumberInput, Paper, SegmentedControl, Select, Stack, Text, Textarea, Title } from '@mantine/core'
import { useQuery } from '@tanstack/react-query'
import { useRef, useState } from 'react'
import { api, unwrap } from '../api/client'
import { useMe, useRole } from '../auth'
import { useBaseModels } from './Adapters'
import { streamCompletion, withPlaygroundKey } from './playground'

/** Where an answer stands: nothing sent yet, streaming, or finished. */
export type AnswerState = 'idle' | 'busy' | 'done'

export const ANSWER_HINT = 'Send a prompt to see the answer here.'

/** One model's answer. Before anything is sent it shows a hint, not "…", which reads as a request in flight. */
export function Answer({ title, text, testId, state }: { title: string; text: string; testId: string; state: AnswerState }) {
  const empty = state === 'idle' ? ANSWER_HINT : state === 'busy' ? '…' : 'No text came back.'
  return (
    <Paper withBorder p="md" radius="md" mih={140}>
      <Text fw={600} mb="xs">
        {title}
      </Text>
      <Text style={{ whiteSpace: 'pre-wrap' }} data-testid={testId} aria-live="polite" c={text ? undefined : 'dimmed'}>
        {text || empty}
      </Text>
    </Paper>
  )
}

export function Playground() {
  const { data: me } = useMe()
  const role = useRole(me)
  const adapters = useQuery({ queryKey: ['adapters'], queryFn: async () => unwrap(await api.GET('/api/v1/adapters')) })
  const baseModels = useBaseModels()
  const servable = (adapters.data ?? []).filter((a) => a.serving_version)
  const [model, setModel] = useState<string | null>(null)
  const [mode, setMode] = useState<'completion' | 'chat'>('completion')
  const [prompt, setPrompt] = useState('')
  const [maxTokens, setMaxTokens] = useState<number>(16)
  const [answers, setAnswers] = useState({ adapter: '', base: '' })
  const [error, setError] = useState<string | null>(null)
  const [busy, setBusy] = useState(false)
  const [sent, setSent] = useState(false)
  const abort = useRef<AbortController | null>(null)
  if (role === 'viewer') return <Text>Viewers cannot call models; ask a member or owner of this tenant.</Text>
  const chosen = servable.find((a) => a.name === model) ?? servable[0]
  const state: AnswerState = busy ? 'busy' : sent ? 'done' : 'idle'
  const run = async (e: React.FormEvent) => {
    e.preventDefault()
    if (!chosen) return
    setBusy(true)
    setSent(true)
    setError(null)
    setAnswers({ adapter: '', base: '' })
    abort.current = new AbortController()
    try {
      const base = chosen.base_model ?? baseModels.data?.[0]
      const signal = abort.current.signal
      await withPlaygroundKey((key) => {
        const common = { key, prompt, mode, maxTokens, signal }
        return Promise.all([
          streamCompletion({ ...common, model: chosen.name, onText: (t) => setAnswers((a) => ({ ...a, adapter: a.adapter + t })) }),
          streamCompletion({ ...common, model: base, onText: (t) => setAnswers((a) => ({ ...a, base: a.base + t })) }),
        ])
      })
    } catch (err) {
      if ((err as Error).name !== 'AbortError') setError((err as Error).message)
    } finally {
      setBusy(false)
    }
  }
  return (
    <Stack>
      <Title order={2}>Playground</Title>
      {servable.length === 0 && !adapters.isLoading && <Text>No adapter is ready yet; upload one first.</Text>}
      <form onSubmit={run} aria-label="Playground">
        <Stack gap="sm">
          <Group align="flex-end" wrap="wrap">
            <Select
              label="Adapter"
              data={servable.map((a) => a.name)}
              value={chosen?.name ?? null}
              onChange={(v) => setModel(v as string | null)}
              allowDeselect={false}
              w={220}
            />
            <SegmentedControl
              aria-label="Mode"
              value={mode}
              onChange={(v) => setMode(v as 'completion' | 'chat')}
              data={[
                { label: 'Completion', value: 'completion' },
                { label: 'Chat', value: 'chat' },
              ]}
            />
            <NumberInput label="Max tokens" value={maxTokens} onChange={(v) => setMaxTokens(Number(v) || 1)} min={1} max={512} w={120} />
          </Group>
          <Textarea label="Prompt" autosize minRows={2} required value={prompt} onChange={(e) => setPrompt(e.currentTarget.value)} />
          <Group>
            <Button type="submit" loading={busy} disabled={!chosen || !prompt}>
              Send
            </Button>
            {busy && (
              <Button variant="outline" onClick={() => abort.current?.abort()}>
                Stop
              </Button>
            )}
          </Group>
        </Stack>
      </form>
      {error && <Alert color="red">{error}</Alert>}
      <Grid>
        <Grid.Col span={{ base: 12, sm: 6 }}>
          <Answer title={`Adapter ${chosen?.name ?? ''}`} text={answers.adapter} testId="answer-adapter" state={state} />
        </Grid.Col>
        <Grid.Col span={{ base: 12, sm: 6 }}>
          <Answer title={`Base model ${chosen?.base_model ?? ''}`} text={answers.base} testId="answer-base" state={state} />
        </Grid.Col>
      </Grid>
    </Stack>
  )
}
