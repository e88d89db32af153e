// Nodes × adapter versions: each cell is the version's tier on that node (engine LoRA slot, engine CPU cache, node disk,
// cold = only in S3, errored), a pinned marker and the size, with the operator actions the cell allows. The rows are
// one page of GET /api/v1/operator/residency (versions, each with its placements), so the map is bounded per page.
import { Badge, Button, Group, Stack, Table, Text } from '@mantine/core'
import type { Placement, ResidencyRow } from '../api/client'
import { versionLabel } from '../format'
import { TierBadge, tierLabel } from './tiers'

export type ActionKind = 'pin' | 'unpin' | 'evict'
export type MapAction = { kind: ActionKind; node: string; placementId: number; versionId: number; label: string }
export type MapRow = { versionId: number; tenant: string; label: string; sizeBytes: number; cells: Record<string, Placement> }

/** One row per adapter version (in the API's order: tenant, adapter, newest version first), cells keyed by node
 * name; the columns are the nodes that hold any version of the page, by name. */
export function buildMap(versions: ResidencyRow[]): { rows: MapRow[]; nodes: string[] } {
  const nodes = new Set<string>()
  const rows = versions.map((v) => {
    const cells: Record<string, Placement> = {}
    for (const p of v.placements) {
      cells[p.node] = p
      nodes.add(p.node)
    }
    return { versionId: v.version_id, tenant: v.tenant, label: versionLabel(`${v.tenant}/${v.adapter}`, v.version), sizeBytes: v.size_bytes, cells }
  })
  return { rows, nodes: [...nodes].sort() }
}

export const fmtBytes = (b: number) => (b >= 1 << 30 ? `${(b / (1 << 30)).toFixed(1)} GiB` : b >= 1 << 20 ? `${(b / (1 << 20)).toFixed(1)} MiB` : `${Math.max(1, Math.round(b / 1024))} KiB`)

/** The actions a placement allows: pin unless pinned, unpin when pinned, evict when in the engine and not pinned. */
export function actionsFor(p: Placement): ActionKind[] {
  if (p.pinned) return ['unpin']
  return p.tier === 'hot' || p.tier === 'warm' || p.served ? ['pin', 'evict'] : ['pin']
}

export function ResidencyMap({ versions, tenant, onAction, onReplicas }: {
  versions: ResidencyRow[]
  tenant: string | null
  onAction: (a: MapAction) => void
  onReplicas?: (row: MapRow) => void
}) {
  const map = buildMap(versions)
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
                      <Text size="xs" c="dimmed">{fmtBytes(row.sizeBytes)}</Text>
                    </Group>
                    <Group gap={4} mt={4} wrap="nowrap">
                      {actionsFor(p).map((k) => (
                        <Button
                          key={k}
                          size="compact-xs"
                          variant="light"
                          color={k === 'evict' ? 'red' : 'blue'}
                          aria-label={`${k} ${row.label} on ${n}`}
                          onClick={() => onAction({ kind: k, node: n, placementId: p.id, versionId: row.versionId, label: row.label })}
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
