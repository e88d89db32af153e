import { QueryClient, QueryClientProvider } from '@tanstack/react-query'
import { fireEvent, screen, waitFor, within } from '@testing-library/react'
import userEvent from '@testing-library/user-event'
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest'
import { api, setCurrentTenant, type ApiKey } from '../api/client'
import { renderWithMantine } from '../components/__tests__/render'
import { expiryInstant } from '../components/expiry'
import { parseAdapterList } from '../components/keyAdapters'
import { changedLimits, createLimits, draftErrors, draftOf, emptyDraft, limitError, limitsText } from '../components/keyLimits'
import { formatDateTime } from '../format'
import { ApiKeys } from '../pages/ApiKeys'

const key = (over: Partial<ApiKey> = {}): ApiKey => ({
  key_id: 'k1', key: 'qv_k1.****', name: 'ci', scopes: ['inference'], adapters: [], enabled: true,
  created_at: '2026-01-01T00:00:00Z', rpm_limit: 60, tpm_limit: null, concurrency_limit: null, max_tokens_limit: null,
  priority_class: null, ...over,
})
const ok = (data: unknown, status = 200) => ({ data, error: undefined, response: new Response('{}', { status }) })
const refused = (error: unknown, status: number) => ({ data: undefined, error, response: new Response('{}', { status }) })

function mockGets(role: string, keys: ApiKey[]) {
  vi.spyOn(api, 'GET').mockImplementation((async (path: string) => {
    if (path === '/api/v1/auth/session')
      return ok({ authenticated: true, me: { username: 'ann', email: '', is_staff: false, tenant: 'acme', tenants: [{ slug: 'acme', name: 'Acme', role }] } })
    if (path === '/api/v1/api-keys') return ok(keys)
    throw new Error(`unexpected GET ${path}`)
  }) as never)
}

function renderPage() {
  const qc = new QueryClient({ defaultOptions: { queries: { retry: false } } })
  renderWithMantine(<QueryClientProvider client={qc}><ApiKeys /></QueryClientProvider>)
}

describe('per-key limits: the values sent', () => {
  it('creation sends only the limits set; an edit only what changed', () => {
    const draft = { ...emptyDraft(), numbers: { ...emptyDraft().numbers, rpm_limit: 30 }, priority: 'low' as const }
    expect(createLimits(draft)).toEqual({ rpm_limit: 30, priority_class: 'low' })
    expect(createLimits(emptyDraft())).toEqual({})
    const k = key()
    expect(changedLimits(k, draftOf(k))).toEqual({})
    expect(changedLimits(k, { ...draftOf(k), numbers: { ...draftOf(k).numbers, rpm_limit: '', tpm_limit: 1000 } }))
      .toEqual({ rpm_limit: null, tpm_limit: 1000 })
  })
  it('words the key list and the API refusals, naming the field', () => {
    expect(limitsText(key({ concurrency_limit: 4, priority_class: 'high' }))).toBe('60 RPM · 4 concurrent · high priority')
    expect(limitsText(key({ rpm_limit: null }))).toBe("tenant's limits only")
    const owner = limitError(Object.assign(new Error("Only an owner can raise or clear 'rpm_limit' on a key; you may only tighten it."), { fields: undefined }))
    expect(owner.fields).toEqual({ rpm_limit: "Only an owner can raise or clear 'rpm_limit' on a key; you may only tighten it." })
    const bad = limitError(Object.assign(new Error('Invalid input.'), { fields: { tpm_limit: ['Ensure this value is greater than or equal to 1.'] } }))
    expect(bad.text).toBe('Tokens per minute (TPM): Invalid input.')
    expect(bad.fields).toEqual({ tpm_limit: 'Ensure this value is greater than or equal to 1.' })
  })
})

describe('API keys page: limits at creation and on an existing key', () => {
  beforeEach(() => setCurrentTenant('acme'))
  afterEach(() => vi.restoreAllMocks())

  it('creates a key with its limits', async () => {
    mockGets('owner', [])
    const post = vi.spyOn(api, 'POST').mockResolvedValue(ok({ ...key(), secret: 'qv_k1.s3cret' }, 201) as never)
    renderPage()
    await userEvent.type(await screen.findByRole('textbox', { name: 'Name' }), 'ci')
    await userEvent.type(screen.getByRole('textbox', { name: 'Requests per minute (RPM)' }), '60')
    await userEvent.click(screen.getByRole('button', { name: 'Create key' }))
    await waitFor(() => expect(post).toHaveBeenCalled())
    expect(post.mock.calls[0][0]).toBe('/api/v1/api-keys')
    expect((post.mock.calls[0][1] as { body: Record<string, unknown> }).body).toMatchObject({ name: 'ci', rpm_limit: 60 })
    expect((post.mock.calls[0][1] as { body: Record<string, unknown> }).body).not.toHaveProperty('tpm_limit')
  })

  it("edits a key's limits and shows the API's 403 with the field named", async () => {
    mockGets('member', [key()])
    const patch = vi.spyOn(api, 'PATCH').mockResolvedValue(refused(
      { detail: "Only an owner can raise or clear 'rpm_limit' on a key; you may only tighten it.", code: 'limit_owner_only' }, 403) as never)
    renderPage()
    expect(await screen.findByText('60 RPM')).toBeInTheDocument()
    await userEvent.click(screen.getByRole('button', { name: 'Edit limits of ci' }))
    const form = await screen.findByRole('form', { name: 'Limits of ci' })
    expect(form).toHaveTextContent('only an owner can raise or clear one')
    const rpm = within(form).getByRole('textbox', { name: 'Requests per minute (RPM)' })
    expect(rpm).toHaveValue('60')
    await userEvent.clear(rpm)
    await userEvent.click(within(form).getByRole('button', { name: 'Save limits' }))
    await waitFor(() => expect(patch).toHaveBeenCalled())
    expect(patch.mock.calls[0][1]).toMatchObject({ params: { path: { key_id: 'k1' } }, body: { rpm_limit: null } })
    expect(await screen.findByRole('alert')).toHaveTextContent("Only an owner can raise or clear 'rpm_limit'")
    expect(rpm).toHaveAttribute('aria-invalid', 'true')
  })
})

describe('key expiry: a 24-hour clock', () => {
  it('reads HH:MM on a 24-hour clock in local time, and names what to fix', () => {
    expect(expiryInstant('', '')).toEqual({ iso: null, error: null })
    expect(expiryInstant('2030-01-02', '17:30').iso).toBe(new Date(2030, 0, 2, 17, 30).toISOString())
    expect(expiryInstant('2030-01-02', '7:05').iso).toBe(new Date(2030, 0, 2, 7, 5).toISOString())
    expect(expiryInstant('2030-01-02', '').iso).toBe(new Date(2030, 0, 2, 0, 0).toISOString())
    expect(expiryInstant('2030-01-02', '5:30 PM').error).toEqual({ field: 'time', text: 'Use a 24-hour time, HH:MM (e.g. 17:30).' })
    expect(expiryInstant('2030-01-02', '24:00').error?.field).toBe('time')
    expect(expiryInstant('', '10:00').error?.field).toBe('date')
  })
})

describe('API keys page: expiry and names not uploaded yet', () => {
  beforeEach(() => setCurrentTenant('acme'))
  afterEach(() => vi.restoreAllMocks())

  it('has no 12-hour picker: a date and a 24-hour time, sent as that instant, echoed as the console writes times', async () => {
    mockGets('owner', [])
    const post = vi.spyOn(api, 'POST').mockResolvedValue(ok({ ...key(), secret: 'qv_k1.s3cret', adapters_not_found: [], warning: null }, 201) as never)
    renderPage()
    await userEvent.type(await screen.findByRole('textbox', { name: 'Name' }), 'ci')
    expect(document.querySelector('input[type="datetime-local"]')).toBeNull()
    fireEvent.change(screen.getByLabelText('Expires on (optional)'), { target: { value: '2030-01-02' } })
    const time = screen.getByRole('textbox', { name: 'at (24-hour, HH:MM)' })
    await userEvent.type(time, '5:30 PM')
    await userEvent.click(screen.getByRole('button', { name: 'Create key' }))
    expect(await screen.findByText('Expires: Use a 24-hour time, HH:MM (e.g. 17:30).')).toBeInTheDocument()
    expect(post).not.toHaveBeenCalled()
    await userEvent.clear(time)
    await userEvent.type(time, '17:30')
    expect(screen.getByText(`Expires ${formatDateTime(new Date(2030, 0, 2, 17, 30))}, your time zone`)).toBeInTheDocument()
    expect(screen.getByText(/17:30:00, your time zone/)).toBeInTheDocument()
    await userEvent.click(screen.getByRole('button', { name: 'Create key' }))
    await waitFor(() => expect(post).toHaveBeenCalled())
    expect((post.mock.calls[0][1] as { body: Record<string, unknown> }).body.expires_at).toBe(new Date(2030, 0, 2, 17, 30).toISOString())
  })

  it("shows the API's warning about adapters that do not exist yet beside the new secret", async () => {
    mockGets('owner', [])
    const warning = 'No adapter or version typo-bot exists yet. The key can call them once they are uploaded under those names; if you meant existing adapters, check the spelling, revoke this key and create it again.'
    const post = vi.spyOn(api, 'POST').mockResolvedValue(ok({ ...key({ adapters: ['typo-bot'] }), secret: 'qv_k1.s3cret', adapters_not_found: ['typo-bot'], warning }, 201) as never)
    renderPage()
    await userEvent.type(await screen.findByRole('textbox', { name: 'Name' }), 'ci')
    await userEvent.type(screen.getByRole('textbox', { name: 'Only these adapters (optional)' }), 'typo-bot')
    await userEvent.click(screen.getByRole('button', { name: 'Create key' }))
    await waitFor(() => expect(post).toHaveBeenCalled())
    expect((post.mock.calls[0][1] as { body: Record<string, unknown> }).body.adapters).toEqual(['typo-bot'])
    expect(await screen.findByTestId('new-key-warning')).toHaveTextContent(warning)
    expect(screen.getByTestId('new-secret')).toHaveTextContent('qv_k1.s3cret')
  })
})

describe('API keys page: what the form refuses before sending, and a clean form after', () => {
  beforeEach(() => setCurrentTenant('acme'))
  afterEach(() => vi.restoreAllMocks())

  const rule = 'use 1-40 lowercase letters, digits or single hyphens, starting and ending with a letter or digit, '
    + 'optionally followed by @N for version N alone (e.g. support-bot or ranker@2); separate names with commas.'

  it('reads adapter names split on commas and newlines only, each checked with the API rule', () => {
    expect(parseAdapterList(' support-bot, ranker@2\nthird ,, ')).toEqual({ names: ['support-bot', 'ranker@2', 'third'], error: null })
    expect(parseAdapterList('nope bot')).toEqual({ names: [], error: `"nope bot" is not an adapter name: ${rule}` })
    expect(parseAdapterList('ok, a--b, Bot@0').error).toBe(`"a--b", "Bot@0" are not adapter names: ${rule}`)
    expect(parseAdapterList('')).toEqual({ names: [], error: null })
  })

  it('marks a limit of 0 instead of clamping it to 1, and never sends it', async () => {
    expect(draftErrors({ ...emptyDraft(), numbers: { ...emptyDraft().numbers, max_tokens_limit: 0, rpm_limit: 5 } }))
      .toEqual({ max_tokens_limit: 'Use a whole number of 1 or more; leave it empty for no limit of its own.' })
    mockGets('owner', [])
    const post = vi.spyOn(api, 'POST').mockResolvedValue(ok({ ...key(), secret: 'qv_k1.s3cret' }, 201) as never)
    renderPage()
    await userEvent.type(await screen.findByRole('textbox', { name: 'Name' }), 'ci')
    const maxTokens = screen.getByRole('textbox', { name: 'Max tokens per request' })
    await userEvent.type(maxTokens, '0')
    await userEvent.tab() // Mantine clamped to `min` on blur
    expect(maxTokens).toHaveValue('0')
    expect(maxTokens).toHaveAttribute('aria-invalid', 'true')
    await userEvent.click(screen.getByRole('button', { name: 'Create key' }))
    expect(await screen.findByText('Max tokens per request: Use a whole number of 1 or more; leave it empty for no limit of its own.')).toBeInTheDocument()
    expect(post).not.toHaveBeenCalled()
  })

  it('names a bad adapter name inline and sends nothing; a good list goes as typed; the form is cleared after', async () => {
    mockGets('owner', [])
    const post = vi.spyOn(api, 'POST').mockResolvedValue(ok({ ...key({ adapters: ['support-bot', 'ranker@2'] }), secret: 'qv_k1.s3cret', adapters_not_found: [], warning: null }, 201) as never)
    renderPage()
    const name = await screen.findByRole('textbox', { name: 'Name' })
    await userEvent.type(name, 'ci')
    const only = screen.getByRole('textbox', { name: 'Only these adapters (optional)' })
    await userEvent.type(only, 'nope bot')
    expect(only).toHaveAttribute('aria-invalid', 'true')
    expect(screen.getAllByText(`"nope bot" is not an adapter name: ${rule}`).length).toBeGreaterThan(0)
    await userEvent.click(screen.getByRole('button', { name: 'Create key' }))
    expect(await screen.findByText(`Only these adapters: "nope bot" is not an adapter name: ${rule}`)).toBeInTheDocument()
    expect(post).not.toHaveBeenCalled()

    await userEvent.clear(only)
    await userEvent.type(only, 'support-bot, ranker@2')
    expect(only).not.toHaveAttribute('aria-invalid', 'true')
    fireEvent.change(screen.getByLabelText('Expires on (optional)'), { target: { value: '2030-01-02' } })
    await userEvent.click(screen.getByRole('checkbox', { name: 'adapters:read' }))
    await userEvent.click(screen.getByRole('button', { name: 'Create key' }))
    await waitFor(() => expect(post).toHaveBeenCalled())
    expect((post.mock.calls[0][1] as { body: Record<string, unknown> }).body.adapters).toEqual(['support-bot', 'ranker@2'])
    expect(await screen.findByTestId('new-secret')).toHaveTextContent('qv_k1.s3cret')
    // Every field back to its start: the allow-list went unnoticed into the next key.
    expect(name).toHaveValue('')
    expect(only).toHaveValue('')
    expect(screen.getByLabelText('Expires on (optional)')).toHaveValue('')
    expect(screen.getByRole('checkbox', { name: 'adapters:read' })).not.toBeChecked()
    expect(screen.getByRole('checkbox', { name: 'inference' })).toBeChecked()
  })
})
