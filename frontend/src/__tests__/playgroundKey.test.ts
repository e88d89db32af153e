import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest'

const post = vi.fn()
vi.mock('../api/client', async (importOriginal) => ({
  ...(await importOriginal<typeof import('../api/client')>()),
  api: { POST: (...args: unknown[]) => post(...args) },
}))

const { setCurrentTenant } = await import('../api/client')
const { playgroundKey, withPlaygroundKey } = await import('../pages/playground')

const minted = (secret: string) => ({
  data: { key_id: 'abc', secret, scopes: ['inference'], expires_at: new Date(Date.now() + 3600e3).toISOString() },
  response: new Response(null, { status: 201 }),
})

describe('the playground key', () => {
  beforeEach(() => {
    setCurrentTenant('acme')
    sessionStorage.clear()
    post.mockReset()
  })
  afterEach(() => setCurrentTenant(null))

  it('asks the server for the one playground key once, then reuses it; never mints through POST /api-keys', async () => {
    post.mockResolvedValueOnce(minted('qv_abc.one'))
    expect(await playgroundKey()).toBe('qv_abc.one')
    expect(await playgroundKey()).toBe('qv_abc.one')
    expect(post).toHaveBeenCalledTimes(1)
    expect(post).toHaveBeenCalledWith('/api/v1/api-keys/playground')
  })

  it('asks again when the gateway refuses the secret (another tab replaced it), once', async () => {
    post.mockResolvedValueOnce(minted('qv_abc.one')).mockResolvedValueOnce(minted('qv_abc.two'))
    const seen: string[] = []
    const answer = await withPlaygroundKey(async (key) => {
      seen.push(key)
      if (key === 'qv_abc.one') throw Object.assign(new Error('invalid key'), { status: 401 })
      return 'ok'
    })
    expect(answer).toBe('ok')
    expect(seen).toEqual(['qv_abc.one', 'qv_abc.two'])
    expect(await playgroundKey()).toBe('qv_abc.two')
    expect(post).toHaveBeenCalledTimes(2)
  })

  it('other errors are not retried', async () => {
    post.mockResolvedValueOnce(minted('qv_abc.one'))
    const call = vi.fn(async () => {
      throw Object.assign(new Error('no node'), { status: 503 })
    })
    await expect(withPlaygroundKey(call)).rejects.toThrow('no node')
    expect(call).toHaveBeenCalledTimes(1)
    expect(post).toHaveBeenCalledTimes(1)
  })
})
