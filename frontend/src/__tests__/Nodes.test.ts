import { describe, expect, it } from 'vitest'
import type { Node } from '../api/client'
import { slotFigures } from '../pages/Nodes'

describe('slotFigures', () => {
  it('labels capacity by the engine setting, never as GPU (the node API reports no device, and CPU nodes have slots too)', () => {
    const cpuNode = { gpu_used: 2, max_loras: 2, cpu_used: 3, max_cpu_loras: 4 } as Node
    expect(slotFigures(cpuNode)).toEqual([
      { label: 'LoRA slots (max_loras)', value: '2/2' },
      { label: 'CPU cache (max_cpu_loras)', value: '3/4' },
    ])
  })
})
