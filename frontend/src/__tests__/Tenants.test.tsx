import { QueryClient, QueryClientProvider } from '@tanstack/react-query'
import { screen } from '@testing-library/react'
import { afterEach, describe, expect, it, vi } from 'vitest'
import { api, type OperatorTenant } from '../api/client'
import { renderWithMantine } from '../components/__tests__/render'
import { Tenants, initialTenant } from '../pages/Tenants'

const tenant = (slug: string): OperatorTenant => ({
  slug, name: `${slug} tenant`, residency_quota: { max_pinned: null, max_gpu_bytes: null },
  limits: { rpm_limit: 60, tpm_limit: null, concurrency_limit: null, max_tokens_limit: null, priority_class: null },
})

describe('Tenants and quotas', () => {
  afterEach(() => vi.restoreAllMocks())

  it('opens on the console’s tenant, else the first', () => {
    expect(initialTenant([tenant('a'), tenant('b')], 'b')).toBe('b')
    expect(initialTenant([tenant('a'), tenant('b')], 'gone')).toBe('a')
    expect(initialTenant([], null)).toBeNull()
  })

  it('shows the only tenant’s forms without a pick', async () => {
    vi.spyOn(api, 'GET').mockResolvedValue({ data: [tenant('demo')], error: undefined, response: new Response('[]', { status: 200 }) } as never)
    const qc = new QueryClient({ defaultOptions: { queries: { retry: false } } })
    renderWithMantine(<QueryClientProvider client={qc}><Tenants /></QueryClientProvider>)
    const form = await screen.findByRole('form', { name: 'Gateway limits of demo' })
    expect(form).toBeInTheDocument()
    expect(screen.getByRole('textbox', { name: 'Requests per minute (RPM)' })).toHaveValue('60')
    expect(screen.getByRole('form', { name: 'Residency quota of demo' })).toBeInTheDocument()
  })
})
