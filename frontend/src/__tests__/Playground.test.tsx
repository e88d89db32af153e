import { QueryClient, QueryClientProvider } from '@tanstack/react-query'
import { screen } from '@testing-library/react'
import userEvent from '@testing-library/user-event'
import { afterEach, describe, expect, it, vi } from 'vitest'
import { setCurrentTenant, type Me } from '../api/client'
import { renderWithMantine } from '../components/__tests__/render'
import { ANSWER_HINT, Playground } from '../pages/Playground'

const streams: { model: string; onText: (t: string) => void; done: () => void }[] = []
vi.mock('../pages/playground', () => ({
  withPlaygroundKey: <T,>(call: (key: string) => Promise<T>) => call('key'),
  streamCompletion: (opts: { model: string; onText: (t: string) => void }) =>
    new Promise<void>((done) => streams.push({ model: opts.model, onText: opts.onText, done })),
}))

const me: Me = { username: 'alice', email: '', is_staff: false, tenant: 'acme', tenants: [{ slug: 'acme', name: 'Acme', role: 'owner' }] }

describe('Playground', () => {
  afterEach(() => {
    setCurrentTenant(null)
    streams.length = 0
  })

  it('shows a hint, not "…", until a prompt is sent; then "…" while waiting, then the answer', async () => {
    setCurrentTenant('acme')
    const qc = new QueryClient({ defaultOptions: { queries: { retry: false, staleTime: Infinity } } })
    qc.setQueryData(['me'], me)
    qc.setQueryData(['adapters'], [{ name: 'capitals', serving_version: 1, base_model: 'tiny-llama' }])
    qc.setQueryData(['base-models'], ['tiny-llama'])
    renderWithMantine(<QueryClientProvider client={qc}><Playground /></QueryClientProvider>)
    const adapter = screen.getByTestId('answer-adapter')
    const base = screen.getByTestId('answer-base')
    expect(adapter).toHaveTextContent(ANSWER_HINT)
    expect(base).toHaveTextContent(ANSWER_HINT)
    expect(adapter).not.toHaveTextContent('…')

    await userEvent.type(screen.getByRole('textbox', { name: /^Prompt/ }), 'Capital of France?')
    await userEvent.click(screen.getByRole('button', { name: 'Send' }))
    await vi.waitFor(() => expect(streams).toHaveLength(2))
    expect(adapter).toHaveTextContent(/^…$/)
    expect(base).toHaveTextContent(/^…$/)
    streams.find((s) => s.model === 'capitals')!.onText(' Paris')
    await vi.waitFor(() => expect(adapter).toHaveTextContent('Paris'))
    expect(base).toHaveTextContent(/^…$/)
  })
})
