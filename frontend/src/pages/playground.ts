// Streaming calls to the OpenAI-compatible gateway with a short-lived inference-only key the console mints.
import { api, currentTenant } from '../api/client'

const KEY_TTL_MS = 60 * 60 * 1000

/** A 1-hour `inference` key for this tenant, minted once per browser tab (sessionStorage). */
export async function playgroundKey(): Promise<string> {
  const slot = `quiver.playground.${currentTenant()}`
  const cached = JSON.parse(sessionStorage.getItem(slot) ?? 'null') as { secret: string; until: number } | null
  if (cached && cached.until > Date.now() + 60_000) return cached.secret
  const until = Date.now() + KEY_TTL_MS
  const res = await api.POST('/api/v1/api-keys', {
    body: { name: 'console playground', scopes: ['inference'] as never, expires_at: new Date(until).toISOString() },
  })
  if (!res.response.ok || !res.data) throw new Error((res.error as { detail?: string })?.detail ?? 'Could not mint a playground key.')
  sessionStorage.setItem(slot, JSON.stringify({ secret: res.data.secret, until }))
  return res.data.secret
}

/** Streams one completion (or chat) from `model`, calling `onText` with each piece; resolves when done. */
export async function streamCompletion(opts: {
  key: string
  model: string
  prompt: string
  mode: 'completion' | 'chat'
  maxTokens: number
  onText: (piece: string) => void
  signal?: AbortSignal
}): Promise<void> {
  const chat = opts.mode === 'chat'
  const body = chat
    ? { model: opts.model, messages: [{ role: 'user', content: opts.prompt }], max_tokens: opts.maxTokens, temperature: 0, stream: true }
    : { model: opts.model, prompt: opts.prompt, max_tokens: opts.maxTokens, temperature: 0, stream: true }
  const res = await fetch(chat ? '/v1/chat/completions' : '/v1/completions', {
    method: 'POST',
    headers: { Authorization: `Bearer ${opts.key}`, 'Content-Type': 'application/json' },
    body: JSON.stringify(body),
    signal: opts.signal,
  })
  if (!res.ok || !res.body) {
    const err = await res.json().catch(() => ({}))
    throw new Error(err?.error?.message ?? `HTTP ${res.status}`)
  }
  const reader = res.body.getReader()
  const decoder = new TextDecoder()
  let buffer = ''
  for (;;) {
    const { done, value } = await reader.read()
    if (done) break
    buffer += decoder.decode(value, { stream: true })
    const events = buffer.split('\n\n')
    buffer = events.pop() ?? ''
    for (const event of events) {
      const data = event.replace(/^data: ?/, '').trim()
      if (!data || data === '[DONE]') continue
      const chunk = JSON.parse(data)
      if (chunk.error) throw new Error(chunk.error.message ?? 'The stream ended with an error.')
      const choice = chunk.choices?.[0]
      const piece = chat ? choice?.delta?.content : choice?.text
      if (piece) opts.onText(piece)
    }
  }
}
