// A node's figures for the Fleet page, pure: slots and cache used, and capacity reported against its ceilings (kept
// apart from the page so it can be tested and the page file exports components only).
import type { Node } from '../api/client'

/** A node's adapter capacity, in vLLM's terms. The node API says nothing of the device (a CPU node has `max_loras`
 * slots too), so the labels name the engine setting, never "GPU". vLLM's CPU cache (`max_cpu_loras`) holds every
 * loaded adapter, those in LoRA slots too, and `cpu_used` counts them all: the label says so and the note splits it,
 * since the figure read as a tier of its own beside the slots (issue 30). */
export function slotFigures(n: Node): { label: string; value: string; note?: string }[] {
  const cacheOnly = Math.max(0, n.cpu_used - n.gpu_used)
  return [
    { label: 'LoRA slots (max_loras)', value: `${n.gpu_used}/${n.max_loras}` },
    {
      label: 'CPU cache, LoRA slots included (max_cpu_loras)',
      value: `${n.cpu_used}/${n.max_cpu_loras}`,
      note: `${n.gpu_used} in LoRA slots + ${cacheOnly} in the CPU cache only`,
    },
  ]
}

const CAPACITY: { field: keyof Node['reported']; label: string }[] = [
  { field: 'max_loras', label: 'LoRA slots' },
  { field: 'max_cpu_loras', label: 'CPU cache' },
  { field: 'max_lora_rank', label: 'LoRA rank' },
]

export type CapacityRow = { label: string; reported: number | null; ceiling: number | null; inForce: number; source: string }

/** Per capacity figure, what the node's last heartbeat reported, the ceiling the operator (or the fleet default) set,
 * and the figure in force: the node's stored one, which placement and routing use (the reported figure clamped to
 * the ceiling, i.e. the smaller of the two; 0 while the node has not reported it). `source` says which it is. */
export function capacityRows(n: Node): CapacityRow[] {
  return CAPACITY.map(({ field, label }) => {
    const reported = n.reported[field]
    const ceiling = n.ceilings[field]
    // The stored figure is the truth; the schema marks it optional, so derive it the server's way if absent.
    const inForce = n[field] ?? (reported == null ? 0 : Math.min(reported, ceiling ?? reported))
    let source: string
    // Not reported counts as 0 (inference/policy/node_capacity.py): nothing is placed against it until a heartbeat says.
    if (reported == null) source = 'nothing reported'
    else if (ceiling == null || reported < ceiling) source = 'reported'
    else if (reported === ceiling) source = 'reported = ceiling'
    else source = 'ceiling, report clamped'
    return { label, reported, ceiling, inForce, source }
  })
}
