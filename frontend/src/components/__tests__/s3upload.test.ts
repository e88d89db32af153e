import { describe, expect, it, vi } from 'vitest'
import { makeSignRequest, sha256Hex } from '../s3upload'

describe('sha256Hex', () => {
  it('matches sha256sum across slice boundaries and reports the bytes hashed', async () => {
    expect(await sha256Hex(new Blob(['abc']))).toBe('ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad')
    const bytes = new Uint8Array(9 * 1024 * 1024 + 7).map((_, i) => i % 251)
    const seen: number[] = []
    const got = await sha256Hex(new Blob([bytes]), (n) => seen.push(n))
    const want = [...new Uint8Array(await crypto.subtle.digest('SHA-256', bytes))].map((b) => b.toString(16).padStart(2, '0')).join('')
    expect(got).toBe(want)
    expect(seen).toEqual([8 * 1024 * 1024, bytes.length])
  })
})

describe('makeSignRequest', () => {
  const base = '/api/v1/adapters/capitals/uploads/abc123'

  it('signs part PUTs on the server and sends them to the presigned S3 URL', async () => {
    document.cookie = 'csrftoken=tok'
    localStorage.setItem('quiver.tenant', 'acme')
    const fetcher = vi.fn(async () => new Response(JSON.stringify({ urls: { '3': 'http://s3/part3' }, expires_in: 600 }), { status: 200 }))
    const sign = makeSignRequest('capitals', 'abc123', fetcher as unknown as typeof fetch)
    expect(await sign({ method: 'PUT', key: 'adapter_model.safetensors', uploadId: 'u', partNumber: 3 })).toEqual({ url: 'http://s3/part3' })
    const [url, init] = fetcher.mock.calls[0] as unknown as [string, RequestInit]
    expect(url).toBe(`${base}/sign`)
    expect(JSON.parse(init.body as string)).toEqual({ name: 'adapter_model.safetensors', part_numbers: [3] })
    expect((init.headers as Record<string, string>)['X-CSRFToken']).toBe('tok')
    expect((init.headers as Record<string, string>)['X-Quiver-Tenant']).toBe('acme')
  })

  it('sends list, complete and abort to the server (which calls S3 itself), never to S3', async () => {
    const fetcher = vi.fn()
    const sign = makeSignRequest('capitals', 'abc123', fetcher as unknown as typeof fetch)
    const list = await sign({ method: 'GET', key: 'adapter_config.json', uploadId: 'u' })
    expect(list.url).toBe(`${base}/parts?name=adapter_config.json&dialect=s3`)
    const complete = await sign({ method: 'POST', key: 'adapter_config.json', uploadId: 'u' })
    expect(complete.url).toBe(`${base}/complete?name=adapter_config.json&dialect=s3`)
    expect(complete.headers?.['X-CSRFToken']).toBe('tok')
    expect((await sign({ method: 'DELETE', key: 'adapter_config.json', uploadId: 'u' })).url).toBe(`${base}/abort`)
    await expect(async () => sign({ method: 'POST', key: 'x' })).rejects.toThrow(/server creates this upload/)
    expect(fetcher).not.toHaveBeenCalled()
  })

  it('uses the part URLs of the create response until they near expiry, then signs on the server', async () => {
    const fetcher = vi.fn(async () => new Response(JSON.stringify({ urls: { '2': 'http://s3/fresh2' }, expires_in: 600 }), { status: 200 }))
    const urls = { 'adapter_model.safetensors': { '1': 'http://s3/part1', '2': 'http://s3/part2' } }
    const sign = makeSignRequest('capitals', 'abc123', fetcher as unknown as typeof fetch, { urls, expiresAt: Date.now() + 600_000 })
    expect(await sign({ method: 'PUT', key: 'adapter_model.safetensors', uploadId: 'u', partNumber: 2 })).toEqual({ url: 'http://s3/part2' })
    expect(fetcher).not.toHaveBeenCalled()
    const stale = makeSignRequest('capitals', 'abc123', fetcher as unknown as typeof fetch, { urls, expiresAt: Date.now() + 30_000 })
    expect(await stale({ method: 'PUT', key: 'adapter_model.safetensors', uploadId: 'u', partNumber: 2 })).toEqual({ url: 'http://s3/fresh2' })
    expect(fetcher).toHaveBeenCalledTimes(1)
  })

  it('answers a fresh upload\'s first listing of each file locally, with no parts; later ones ask the server', async () => {
    const sign = makeSignRequest('capitals', 'abc123', vi.fn() as unknown as typeof fetch, null, true)
    const first = await sign({ method: 'GET', key: 'adapter_config.json', uploadId: 'u' })
    expect(first.url.startsWith('data:application/xml,')).toBe(true)
    expect(decodeURIComponent(first.url)).toContain('<ListPartsResult></ListPartsResult>')
    expect((await sign({ method: 'GET', key: 'adapter_model.safetensors', uploadId: 'u' })).url.startsWith('data:')).toBe(true)
    expect((await sign({ method: 'GET', key: 'adapter_config.json', uploadId: 'u' })).url).toBe(`${base}/parts?name=adapter_config.json&dialect=s3`)
  })

  it('surfaces the server refusing a part', async () => {
    const fetcher = vi.fn(async () => new Response(JSON.stringify({ detail: 'Upload abc is aborted; start a new upload.' }), { status: 409 }))
    const sign = makeSignRequest('capitals', 'abc123', fetcher as unknown as typeof fetch)
    await expect(sign({ method: 'PUT', key: 'a', uploadId: 'u', partNumber: 1 })).rejects.toThrow(/aborted/)
  })
})
