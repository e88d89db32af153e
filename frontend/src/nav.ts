// What the navbar offers and where a login lands, from who is signed in: pure, so the rules are tested without a browser.
import type { Me } from './api/client'

export type Role = 'viewer' | 'member' | 'owner'
export type NavItem = { to: string; label: string; section: 'operator' | 'tenant'; disabledReason?: string }

const RANK: Record<Role, number> = { viewer: 0, member: 1, owner: 2 }

/** Tenant pages with the least role that can use them (the API's role maps: keys and the playground's minted
 * `inference` key need member). */
const TENANT_PAGES: { to: string; label: string; minRole: Role }[] = [
  { to: '/adapters', label: 'Adapters', minRole: 'viewer' },
  { to: '/keys', label: 'API keys', minRole: 'member' },
  { to: '/playground', label: 'Playground', minRole: 'member' },
  { to: '/usage', label: 'Usage', minRole: 'viewer' },
  { to: '/members', label: 'Members', minRole: 'viewer' },
]
const OPERATOR_PAGES = [
  { to: '/operator/nodes', label: 'Fleet' },
  { to: '/operator/residency', label: 'Residency map' },
  { to: '/operator/traffic', label: 'Traffic' },
  { to: '/operator/tenants', label: 'Tenants and quotas' },
  { to: '/operator/audit', label: 'Audit log' },
]

/** The caller's role in `tenant` (staff read every tenant as viewers unless also members), or null. */
export function roleIn(me: Me, tenant: string | null): Role | null {
  return (me.tenants.find((t) => t.slug === tenant)?.role as Role | undefined) ?? null
}

/** Navbar items: operator pages first for staff (their work), then the chosen tenant's pages. A tenant page the role
 * cannot use stays listed, disabled, with the reason, so a viewer learns what a member could do. */
export function navItems(me: Me, tenant: string | null): NavItem[] {
  const items: NavItem[] = me.is_staff ? OPERATOR_PAGES.map((p) => ({ ...p, section: 'operator' as const })) : []
  const role = roleIn(me, tenant)
  if (role) {
    for (const p of TENANT_PAGES) {
      const allowed = RANK[role] >= RANK[p.minRole]
      items.push({
        to: p.to, label: p.label, section: 'tenant',
        ...(allowed ? {} : { disabledReason: `Needs the ${p.minRole} role in ${tenant}; yours is ${role}.` }),
      })
    }
  }
  return items
}

/** Where a login (and the bare `/`) lands: operators on the fleet, others on their tenant's adapters. */
export function landingPath(me: Me): string {
  return me.is_staff ? '/operator/nodes' : '/adapters'
}

/** What the header's tenant picker says while no tenant is chosen. Staff have a real default, the operator pages
 * over every tenant, so the picker says so instead of asking; anyone else is asked to pick one. */
export function tenantPlaceholder(me: Me): string {
  return me.is_staff ? 'All tenants (operator)' : 'Pick a tenant'
}
