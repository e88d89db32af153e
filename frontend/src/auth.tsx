// Session state: who is logged in (GET /api/v1/auth/me) and which tenant the console acts in.
import { useQuery, useQueryClient } from '@tanstack/react-query'
import { api, currentTenant, setCurrentTenant, unwrap, type Me } from './api/client'

export function useMe() {
  return useQuery<Me | null>({
    queryKey: ['me'],
    queryFn: async () => {
      const res = await api.GET('/api/v1/auth/me')
      if (res.response.status === 401) return null
      const me = unwrap(res)
      // Keep the stored choice only while it is still one of the user's tenants.
      const stored = currentTenant()
      const slugs = me.tenants.map((t) => t.slug)
      if (!stored || !slugs.includes(stored)) setCurrentTenant(me.tenant ?? (slugs.length === 1 ? slugs[0] : null))
      return me
    },
    staleTime: 60_000,
  })
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
