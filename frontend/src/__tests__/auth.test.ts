import { afterEach, describe, expect, it, vi } from 'vitest'
import { api, currentTenant, setCurrentTenant } from '../api/client'
import { fetchMe } from '../auth'

const answer = (body: unknown) => ({ data: body, error: undefined, response: new Response(JSON.stringify(body), { status: 200 }) })

describe('fetchMe', () => {
  afterEach(() => {
    vi.restoreAllMocks()
    setCurrentTenant(null)
  })

  it('asks the session probe, which answers 200 before login: no failed request, and no user', async () => {
    const get = vi.spyOn(api, 'GET').mockResolvedValue(answer({ authenticated: false, me: null }) as never)
    expect(await fetchMe()).toBeNull()
    expect(get).toHaveBeenCalledTimes(1)
    expect(get.mock.calls[0][0]).toBe('/api/v1/auth/session')
  })

  it('returns the signed-in user and keeps their only tenant as the console’s', async () => {
    const me = { username: 'olga', email: '', is_staff: false, tenant: null, tenants: [{ slug: 'demo', name: 'Demo', role: 'owner' }] }
    vi.spyOn(api, 'GET').mockResolvedValue(answer({ authenticated: true, me }) as never)
    expect(await fetchMe()).toEqual(me)
    expect(currentTenant()).toBe('demo')
  })
})
