// The app frame: header with the tenant picker and logout, a navbar that collapses behind a burger below 768 px.
import { Alert, Anchor, AppShell, Burger, Button, Group, NavLink, Select, Text, Title } from '@mantine/core'
import { useDisclosure } from '@mantine/hooks'
import { useQueryClient } from '@tanstack/react-query'
import { NavLink as RouterLink, Navigate, Outlet, useLocation, useNavigate } from 'react-router'
import { api, currentTenant, setCurrentTenant } from './api/client'
import { useMe, usePickTenant } from './auth'
import { InvitationsBanner } from './components/Invitations'
import { landingPath, navItems, tenantPlaceholder, type NavItem } from './nav'

export function Shell() {
  const { data: me, isLoading } = useMe()
  const [opened, { toggle, close }] = useDisclosure()
  const pick = usePickTenant()
  const qc = useQueryClient()
  const navigate = useNavigate()
  const location = useLocation()
  if (isLoading) return null
  if (!me) return <Navigate to="/login" replace state={{ from: location.pathname }} />
  const tenant = currentTenant()
  const logout = async () => {
    await api.POST('/api/v1/auth/logout')
    setCurrentTenant(null)
    qc.clear()
    navigate('/login')
  }
  const links = navItems(me, tenant)
  const blocked = links.find((l) => l.disabledReason && location.pathname.startsWith(l.to))
  return (
    <AppShell header={{ height: 60 }} navbar={{ width: 220, breakpoint: 'sm', collapsed: { mobile: !opened } }} padding="md">
      <AppShell.Header>
        {/* At 390 px the picker takes whatever the title leaves (it shrinks, never pushes out of the header). */}
        <Group h="100%" px="md" justify="space-between" wrap="nowrap" gap="sm">
          <Group wrap="nowrap" gap="sm" style={{ flexShrink: 0 }}>
            <Burger opened={opened} onClick={toggle} hiddenFrom="sm" size="sm" aria-label="Toggle navigation" />
            <Title order={3}>Quiver</Title>
          </Group>
          <Group wrap="nowrap" gap="xs" justify="flex-end" style={{ flex: 1, minWidth: 0 }}>
            <Select
              aria-label="Tenant"
              placeholder={tenantPlaceholder(me)}
              data={me.tenants.map((t) => ({ value: t.slug, label: `${t.name} (${t.role})` }))}
              value={tenant}
              onChange={(v) => v && pick(v)}
              allowDeselect={false}
              maw={280}
              style={{ flex: 1, minWidth: 0 }}
              comboboxProps={{ withinPortal: true }}
            />
            <Button variant="subtle" onClick={logout} visibleFrom="xs">
              Log out
            </Button>
          </Group>
        </Group>
      </AppShell.Header>
      <AppShell.Navbar p="xs" aria-label="Main">
        {links.map((l, i) => (
          <NavEntry key={l.to} item={l} heading={me.is_staff && links[i - 1]?.section !== l.section ? l.section : null} onClick={close} />
        ))}
        <Text size="xs" c="dimmed" mt="auto" p="xs">
          Signed in as {me.username}
          {me.is_staff ? ' (operator)' : ''}
        </Text>
        <Button variant="subtle" onClick={logout} hiddenFrom="xs">
          Log out
        </Button>
      </AppShell.Navbar>
      <AppShell.Main>
        <InvitationsBanner />
        {location.pathname === '/' ? (
          <Outlet /> /* the index route: Landing sends staff to the fleet, others to their adapters */
        ) : location.pathname.startsWith('/operator') ? (
          me.is_staff ? <Outlet /> : <OperatorOnly />
        ) : blocked ? (
          <RoleOnly item={blocked} />
        ) : tenant ? (
          <Outlet />
        ) : (
          <TenantPicker />
        )}
      </AppShell.Main>
    </AppShell>
  )
}

/** One navbar entry; a page the role cannot use is shown disabled with the reason (no link). Staff get section
 * headings, since they see operator and tenant pages together. */
function NavEntry({ item, heading, onClick }: { item: NavItem; heading: string | null; onClick: () => void }) {
  return (
    <>
      {heading && (
        <Text size="xs" fw={700} c="dimmed" tt="uppercase" px="xs" pt="xs">
          {heading === 'operator' ? 'Operator' : `Tenant ${currentTenant() ?? ''}`}
        </Text>
      )}
      {item.disabledReason ? (
        <NavLink label={item.label} description={item.disabledReason} disabled aria-disabled="true" />
      ) : (
        <NavLink component={RouterLink} to={item.to} label={item.label} onClick={onClick} />
      )}
    </>
  )
}

/** Where `/` leads once signed in (the login form goes to the same place). */
export function Landing() {
  const { data: me } = useMe()
  return me ? <Navigate to={landingPath(me)} replace /> : null
}

/** A tenant page the current role cannot use, opened by URL: the reason instead of the API's 403s. */
function RoleOnly({ item }: { item: NavItem }) {
  return (
    <div>
      <Title order={2} mb="md">
        {item.label}
      </Title>
      <Alert color="yellow" role="alert" title="Not available with your role">
        {item.disabledReason}
      </Alert>
    </div>
  )
}

/** What a non-staff user sees on /operator/*: a plain explanation instead of the API's 403s. */
function OperatorOnly() {
  return (
    <div>
      <Title order={2} mb="md">
        Operators only
      </Title>
      <Alert color="yellow" role="alert" title="This page is for fleet operators">
        The fleet, residency, traffic and quota pages need a staff account. Your own adapters, keys and usage are under{' '}
        <Anchor component={RouterLink} to="/adapters">Adapters</Anchor>.
      </Alert>
    </div>
  )
}

function TenantPicker() {
  const { data: me } = useMe()
  const pick = usePickTenant()
  return (
    <div>
      <Title order={2} mb="md">
        Pick a tenant
      </Title>
      {me?.tenants.length === 0 && (
        <Text>You belong to no tenant yet: a tenant owner invites you, and the invitation appears above to accept.</Text>
      )}
      <Group>
        {me?.tenants.map((t) => (
          <Button key={t.slug} variant="light" onClick={() => pick(t.slug)}>
            {t.name} ({t.role})
          </Button>
        ))}
      </Group>
    </div>
  )
}
