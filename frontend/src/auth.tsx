// Session state: who is logged in (GET /api/v1/auth/session) and which tenant the console acts in.
import { useQuery, useQueryClient } from '@tanstack/react-query'
import { api, currentTenant, setCurrentTenant, unwrap, type Me } from './api/client'

/** Who is signed in, or null. Asks `/auth/session`, which answers 200 `{authenticated: false}` before login, so
 * opening the console logs no failed request (`/auth/me` answers 401 then, for API clients). */
export async function fetchMe(): Promise<Me | null> {
  const session = unwrap(await api.GET('/api/v1/auth/session'))
  if (!session.authenticated || !session.me) return null
  const me = session.me
  // Keep the stored choice only while it is still one of the user's tenants.
  const stored = currentTenant()
  const slugs = me.tenants.map((t) => t.slug)
  if (!stored || !slugs.includes(stored)) setCurrentTenant(me.tenant ?? (slugs.length === 1 ? slugs[0] : null))
  return me
}

export function useMe() {
  return useQuery<Me | null>({ queryKey: ['me'], queryFn: fetchMe, staleTime: 60_000 })
}

export function useRole(me: Me | null | undefined): string | null {
  const slug = currentTenant()
  return me?.tenants.find((t) => t.slug === slug)?.role ?? null
}

export function usePickTenant() {
  const qc = useQueryClient()
  return async (slug: string) => {
    setCurrentTenant(slug)
    await api.POST('/api/v1/auth/tenant', { body: { tenant: slug } })
    await qc.invalidateQueries()
  }
}
