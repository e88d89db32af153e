// Nodes × adapter versions: each cell is the version's tier on that node (engine LoRA slot, engine CPU cache, node disk,
// cold = only in S3, errored), a pinned marker and the size, with the operator actions the cell allows.
import { Badge, Button, Group, Stack, Table, Text } from '@mantine/core'
import type { Node, Placement } from '../api/client'
import { versionLabel } from '../format'
import { TierBadge, tierLabel } from './tiers'

export type ActionKind = 'pin' | 'unpin' | 'evict'
export type MapAction = { kind: ActionKind; node: string; placementId: number; versionId: number; label: string }
export type MapRow = { versionId: number; tenant: string; label: string; cells: Record<string, Placement> }

/** One row per adapter version (sorted by tenant, adapter, newest version first), cells keyed by node name;
 * `tenant` (a slug) keeps only that tenant's versions. */
export function buildMap(nodes: Node[], tenant: string | null): { rows: MapRow[]; nodes: string[] } {
  const rows = new Map<number, MapRow>()
  for (const n of nodes) {
    for (const p of n.placements) {
      if (tenant && p.tenant !== tenant) continue
      const row = rows.get(p.version_id) ?? { versionId: p.version_id, tenant: p.tenant, label: versionLabel(`${p.tenant}/${p.adapter}`, p.version), cells: {} }
      row.cells[n.name] = p
      rows.set(p.version_id, row)
    }
  }
  const sorted = [...rows.values()].sort((a, b) => a.label.localeCompare(b.label, undefined, { numeric: true }))
  return { rows: sorted, nodes: nodes.map((n) => n.name).sort() }
}

export const fmtBytes = (b: number) => (b >= 1 << 30 ? `${(b / (1 << 30)).toFixed(1)} GiB` : b >= 1 << 20 ? `${(b / (1 << 20)).toFixed(1)} MiB` : `${Math.max(1, Math.round(b / 1024))} KiB`)

/** The actions a placement allows: pin unless pinned, unpin when pinned, evict when in the engine and not pinned. */
export function actionsFor(p: Placement): ActionKind[] {
  if (p.pinned) return ['unpin']
  return p.tier === 'hot' || p.tier === 'warm' || p.served ? ['pin', 'evict'] : ['pin']
}

export function ResidencyMap({ nodes, tenant, onAction, onReplicas }: {
  nodes: Node[]
  tenant: string | null
  onAction: (a: MapAction) => void
  onReplicas?: (row: MapRow) => void
}) {
  const map = buildMap(nodes, tenant)
  if (map.rows.length === 0) return <Text c="dimmed">No adapter version is placed on any node{tenant ? ` for ${tenant}` : ''}.</Text>
  return (
    <Table.ScrollContainer minWidth={240 + 200 * map.nodes.length}>
      <Table withColumnBorders aria-label="Residency map">
        <Table.Thead>
          <Table.Tr>
            <Table.Th>Adapter version</Table.Th>
            {map.nodes.map((n) => (
              <Table.Th key={n}>{n}</Table.Th>
            ))}
          </Table.Tr>
        </Table.Thead>
        <Table.Tbody>
          {map.rows.map((row) => (
            <Table.Tr key={row.versionId}>
              <Table.Th scope="row">
                <Stack gap={4} align="flex-start">
                  <Text size="sm" fw={600}>{row.label}</Text>
                  {onReplicas && (
                    <Button size="compact-xs" variant="subtle" onClick={() => onReplicas(row)} aria-label={`Replicas of ${row.label}`}>
                      replicas
                    </Button>
                  )}
                </Stack>
              </Table.Th>
              {map.nodes.map((n) => {
                const p = row.cells[n]
                if (!p) return <Table.Td key={n} aria-label={`${row.label} on ${n}: not placed`}><Text c="dimmed" size="xs">—</Text></Table.Td>
                const tier = tierLabel(p.tier)
                return (
                  <Table.Td key={n} aria-label={`${row.label} on ${n}: ${tier}${p.pinned ? ', pinned' : ''}`} data-testid={`cell-${row.label}-${n}`}>
                    <Group gap={4} wrap="nowrap">
                      <TierBadge tier={p.tier} />
                      {p.pinned && <Badge color="indigo" variant="outline">pinned</Badge>}
                      <Text size="xs" c="dimmed">{fmtBytes(p.size_bytes)}</Text>
                    </Group>
                    <Group gap={4} mt={4} wrap="nowrap">
                      {actionsFor(p).map((k) => (
                        <Button
                          key={k}
                          size="compact-xs"
                          variant="light"
                          color={k === 'evict' ? 'red' : 'blue'}
                          aria-label={`${k} ${row.label} on ${n}`}
                          onClick={() => onAction({ kind: k, node: n, placementId: p.id, versionId: p.version_id, label: row.label })}
                        >
                          {k}
                        </Button>
                      ))}
                    </Group>
                  </Table.Td>
                )
              })}
            </Table.Tr>
          ))}
        </Table.Tbody>
      </Table>
    </Table.ScrollContainer>
  )
}
