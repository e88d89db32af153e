import { QueryClient, QueryClientProvider } from '@tanstack/react-query'
import { screen } from '@testing-library/react'
import userEvent from '@testing-library/user-event'
import { afterEach, describe, expect, it, vi } from 'vitest'
import { api, type AdapterVersion, type Schemas } from '../../api/client'
import { ServingPanel } from '../ServingPanel'
import { changesCount, promoteBlocked } from '../serving'
import { renderWithMantine } from './render'

const version = (number: number): AdapterVersion => ({
  adapter: 'bot', number, status: 'ready', sha256: 'a'.repeat(64), size_bytes: 1, files: [], created_at: '2026-12-07T09:00:00Z',
})
const change = (i: number): Schemas['ServingChange'] => ({
  actor: 'alice', key_name: null, action: 'promote', before: [[1, 100]], after: [[2, 100]],
  created_at: `2026-12-07T09:${String(59 - i).padStart(2, '0')}:00Z`,
})
const ok = (data: unknown) => ({ data, error: undefined, response: new Response('{}', { status: 200 }) })

function renderPanel(rule: Schemas['RuleEntry'][], changes: number) {
  const serving: Schemas['ServingOutput'] = {
    adapter: 'bot', rule, previous_rule: [{ version: 2, weight: 100 }], auto_promote: false, rpm_limit: null,
    tpm_limit: null, history: Array.from({ length: changes }, (_, i) => change(i)),
  }
  vi.spyOn(api, 'GET').mockImplementation((async (path: string) => {
    if (path === '/api/v1/adapters/{name}/serving') return ok(serving)
    if (path === '/api/v1/usage/versions') return ok([])
    throw new Error(`unexpected GET ${path}`)
  }) as never)
  const qc = new QueryClient({ defaultOptions: { queries: { retry: false } } })
  renderWithMantine(
    <QueryClientProvider client={qc}>
      <ServingPanel name="bot" versions={[version(2), version(1)]} canEdit />
    </QueryClientProvider>,
  )
}

describe('serving panel: nothing to promote, and every change reachable', () => {
  afterEach(() => vi.restoreAllMocks())

  it('words: a version alone at 100 % has nothing to promote; the change count never claims completeness', () => {
    expect(promoteBlocked([{ version: 1, weight: 100 }], 1)).toBe('v1 already takes all traffic.')
    expect(promoteBlocked([{ version: 1, weight: 100 }], 2)).toBeNull()
    expect(promoteBlocked([{ version: 1, weight: 90 }, { version: 2, weight: 10 }], 1)).toBeNull()
    expect(promoteBlocked([], 1)).toBeNull()
    expect(changesCount(3, false)).toBe('3 in all')
    expect(changesCount(7, false)).toBe('latest 5 of 7')
    expect(changesCount(7, true)).toBe('7 in all')
    expect(changesCount(20, false)).toBe('latest 5 of the latest 20')
    expect(changesCount(20, true)).toBe('the latest 20; older ones are not listed')
  })

  it('disables Promote for the version already taking all traffic, and enables it for another', async () => {
    renderPanel([{ version: 1, weight: 100 }], 1)
    const select = await screen.findByRole('combobox', { name: 'Version' })
    await userEvent.selectOptions(select, '1')
    expect(await screen.findByTestId('promote-blocked')).toHaveTextContent('v1 already takes all traffic.')
    expect(screen.getByRole('button', { name: 'Promote' })).toBeDisabled()
    await userEvent.selectOptions(select, '2')
    expect(screen.getByRole('button', { name: 'Promote' })).toBeEnabled()
    expect(screen.queryByTestId('promote-blocked')).toBeNull()
  })

  it('lists the latest 5 changes with their count, and all of them on request', async () => {
    renderPanel([{ version: 2, weight: 100 }], 7)
    expect(await screen.findByTestId('changes-count')).toHaveTextContent('latest 5 of 7')
    expect(screen.getAllByTestId('serving-change')).toHaveLength(5)
    await userEvent.click(screen.getByRole('button', { name: 'Show all 7 changes' }))
    expect(screen.getAllByTestId('serving-change')).toHaveLength(7)
    expect(screen.getByTestId('changes-count')).toHaveTextContent('7 in all')
    expect(screen.getAllByTestId('serving-change')[0]).toHaveTextContent('Dec 7, 2026, 09:59:00') // month as a word
  })
})
