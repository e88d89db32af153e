// Streaming calls to the OpenAI-compatible gateway with the caller's playground key: an inference-only key the
// server keeps one of per user and tenant (POST /api/v1/api-keys/playground replaces its secret and shows it once),
// so visits never add keys to the tenant's list.
import { api, currentTenant, unwrap } from '../api/client'

const KEY_TTL_MS = 60 * 60 * 1000

/** The playground key's secret for this tenant: kept for this tab (sessionStorage) until a minute before it expires;
 * `fresh` asks the server again (the old secret then stops working, in every tab that held it). */
export async function playgroundKey({ fresh = false }: { fresh?: boolean } = {}): Promise<string> {
  const slot = `quiver.playground.${currentTenant()}`
  const cached = JSON.parse(sessionStorage.getItem(slot) ?? 'null') as { secret: string; until: number } | null
  if (!fresh && cached && cached.until > Date.now() + 60_000) return cached.secret
  const key = unwrap(await api.POST('/api/v1/api-keys/playground'))
  const until = key.expires_at ? Date.parse(key.expires_at) : Date.now() + KEY_TTL_MS
  sessionStorage.setItem(slot, JSON.stringify({ secret: key.secret, until }))
  return key.secret
}

/** Runs `call` with the playground key; when the gateway refuses it (401: another tab asked for the key since, which
 * replaced its secret), asks for a fresh secret and runs `call` once more. */
export async function withPlaygroundKey<T>(call: (key: string) => Promise<T>): Promise<T> {
  try {
    return await call(await playgroundKey())
  } catch (err) {
    if ((err as { status?: number }).status !== 401) throw err
    return call(await playgroundKey({ fresh: true }))
  }
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
    throw Object.assign(new Error(err?.error?.message ?? `HTTP ${res.status}`), { status: res.status })
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
