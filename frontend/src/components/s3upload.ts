// Browser-direct upload (adapters_app/direct_upload.py): hash each file (sha256, hash-wasm, in slices), declare the
// files to /api/v1/adapters/{name}/uploads, then Uppy's S3 client PUTs every part straight to S3 on presigned URLs.
// The server creates the S3 multipart uploads, so each Uppy file starts with its `s3Multipart` state set and Uppy
// takes its resume path: list the parts S3 holds, PUT the rest, complete. `signRequest` maps those S3 requests:
// part PUTs to the presigned S3 URLs the create response carries (or from /sign past those, or once they expire),
// list / complete / abort to the Django endpoints that speak S3's XML, so the server completes the upload itself.
// After a dropped connection, resume() lists the parts again and goes on. The very first listing of a file is
// answered here (a just-created upload holds no parts): each request saved is web CPU saved (scripts/bench_upload).
import AwsS3 from '@uppy/aws-s3'
import Uppy from '@uppy/core'
import { createSHA256 } from 'hash-wasm'
import { api, consoleHeaders, unwrap, type Schemas } from '../api/client'
import type { Progress, UploadHandle, Uploader } from './upload'

type UploadOut = Schemas['UploadOutput']
type UploadCreated = Schemas['UploadCreated']
const HASH_SLICE = 8 << 20
const SETTLED = new Set(['done', 'failed', 'aborted'])

const cancelledError = () => Object.assign(new Error('Upload cancelled.'), { cancelled: true })

/** Hex sha256 of a file, read in 8 MiB slices (never whole in memory); `onBytes` gets the bytes hashed so far. */
export async function sha256Hex(file: Blob, onBytes?: (n: number) => void, signal?: AbortSignal): Promise<string> {
  const hasher = await createSHA256()
  hasher.init()
  for (let offset = 0; offset < file.size; offset += HASH_SLICE) {
    if (signal?.aborted) throw cancelledError()
    hasher.update(new Uint8Array(await file.slice(offset, offset + HASH_SLICE).arrayBuffer()))
    onBytes?.(Math.min(offset + HASH_SLICE, file.size))
  }
  return hasher.digest('hex')
}

type S3Request = { method: string; key: string; uploadId?: string; partNumber?: number }

/** Part URLs signed in advance: `{file name: {part number: URL}}`, usable until `expiresAt` (ms since the epoch). */
export type Presigned = { urls: Record<string, Record<string, string>>; expiresAt: number }

const EMPTY_LISTING = 'data:application/xml,' + encodeURIComponent('<?xml version="1.0" encoding="UTF-8"?><ListPartsResult></ListPartsResult>')
const URL_MARGIN_MS = 60_000 // a part PUT may start just before expiry and still be sending

/** Uppy's `signRequest` for one upload: `key` is the declared file name; the server maps it to its own S3 key.
 *  `presigned` (from the create response) spares a /sign request per part; `fresh` (true for an upload just
 *  created) answers each file's first listing locally, with no parts. */
export function makeSignRequest(adapter: string, uploadId: string, fetcher: typeof fetch = fetch,
  presigned: Presigned | null = null, fresh = false) {
  const base = `/api/v1/adapters/${encodeURIComponent(adapter)}/uploads/${uploadId}`
  const listed = new Set<string>()
  return async (req: S3Request): Promise<{ url: string; headers?: Record<string, string> }> => {
    const name = encodeURIComponent(req.key)
    if (req.method === 'PUT' && req.partNumber) {
      const ready = presigned?.urls[req.key]?.[String(req.partNumber)]
      if (ready && Date.now() < presigned!.expiresAt - URL_MARGIN_MS) return { url: ready }
      const res = await fetcher(`${base}/sign`, {
        method: 'POST',
        credentials: 'same-origin',
        headers: { 'Content-Type': 'application/json', ...consoleHeaders('POST') },
        body: JSON.stringify({ name: req.key, part_numbers: [req.partNumber] }),
      })
      const body = await res.json()
      if (!res.ok) throw new Error(body?.detail ?? `Signing part ${req.partNumber} failed (HTTP ${res.status}).`)
      return { url: body.urls[String(req.partNumber)] }
    }
    if (req.method === 'GET' && req.uploadId) {
      const first = fresh && !listed.has(req.key)
      listed.add(req.key)
      if (first) return { url: EMPTY_LISTING }
      return { url: `${base}/parts?name=${name}&dialect=s3`, headers: consoleHeaders('GET') }
    }
    if (req.method === 'POST' && req.uploadId) return { url: `${base}/complete?name=${name}&dialect=s3`, headers: consoleHeaders('POST') }
    if (req.method === 'DELETE' && req.uploadId) return { url: `${base}/abort`, headers: consoleHeaders('DELETE') }
    throw new Error(`The server creates this upload; unexpected S3 request ${req.method} ${req.key}.`)
  }
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms))

export const s3Uploader: Uploader = (adapter, files, baseModel, onProgress) => {
  const abort = new AbortController()
  let uppy: Uppy | null = null
  let upload: UploadCreated | null = null
  const sizes = files.map((f) => f.size)
  const total = sizes.reduce((a, b) => a + b, 0)
  const sent = files.map(() => 0)
  const report = (phase: Progress['phase'], stalled: string | null = null) =>
    onProgress({ loaded: sent.reduce((a, b) => a + b, 0), total, perFile: sent.map((s, i) => (sizes[i] ? s / sizes[i] : 1)), phase, stalled })

  const run = async (): Promise<{ status: number; body: any }> => {
    const hashed = files.map(() => 0)
    const declared = []
    for (const [i, f] of files.entries()) {
      const sha256 = await sha256Hex(f, (n) => {
        hashed[i] = n
        onProgress({ loaded: 0, total, perFile: sent.map(() => 0), phase: 'hashing', hashed: hashed.reduce((a, b) => a + b, 0) })
      }, abort.signal)
      declared.push({ name: f.name, size: f.size, sha256 })
    }
    if (abort.signal.aborted) throw cancelledError()
    const created = await api.POST('/api/v1/adapters/{adapter_name}/uploads', {
      params: { path: { adapter_name: adapter } },
      body: { files: declared, base_model: baseModel ?? '' },
    })
    if (!created.response.ok) return { status: created.response.status, body: created.error }
    upload = created.data as UploadCreated
    if (abort.signal.aborted) {
      await cancelOnServer()
      throw cancelledError()
    }
    const u = new Uppy({ autoProceed: false, allowMultipleUploadBatches: true })
    uppy = u
    u.use(AwsS3, {
      shouldUseMultipart: true,
      getChunkSize: () => upload!.part_size,
      limit: 4,
      signRequest: makeSignRequest(adapter, upload.id, fetch, {
        urls: upload.part_urls, expiresAt: Date.now() + upload.expires_in * 1000,
      }, true) as any,
    })
    const ids = files.map((f, i) => {
      const id = u.addFile({ name: f.name, type: f.type || 'application/octet-stream', data: f, source: 'quiver' })
      u.setFileState(id, { s3Multipart: { uploadId: upload!.files[i].upload_id, key: f.name } } as any)
      return id
    })
    u.on('upload-progress', (file, p) => {
      const i = ids.indexOf(file!.id)
      if (i >= 0) sent[i] = p.bytesUploaded
      report('uploading')
    })
    u.on('upload-success', (file) => {
      const i = ids.indexOf(file!.id)
      if (i >= 0) sent[i] = sizes[i]
      report('uploading')
    })
    report('uploading')
    let result = await u.upload()
    // A dropped connection fails the file after Uppy's own retries; wait for resume() (or coming back online).
    while (result && result.failed && result.failed.length > 0) {
      if (abort.signal.aborted) throw cancelledError()
      report('uploading', 'The connection dropped; the parts already in S3 are kept.')
      await new Promise<void>((resolve, reject) => {
        resumeNow = resolve
        abort.signal.addEventListener('abort', () => reject(cancelledError()), { once: true })
        window.addEventListener('online', () => resolve(), { once: true })
      })
      report('uploading')
      result = await u.retryAll()
    }
    if (abort.signal.aborted) throw cancelledError()
    report('verifying')
    for (;;) {
      const got = unwrap(
        await api.GET('/api/v1/adapters/{adapter_name}/uploads/{public_id}', { params: { path: { adapter_name: adapter, public_id: upload.id } } }),
      ) as UploadOut
      if (SETTLED.has(got.state)) {
        if (got.state === 'done') return { status: 201, body: { adapter, number: got.version, status: 'uploaded' } }
        const error = (got.error ?? {}) as { detail?: string; code?: string }
        return { status: 400, body: { detail: error.detail ?? `Upload ${got.state}.`, code: error.code } }
      }
      await sleep(500)
    }
  }

  let resumeNow: (() => void) | null = null
  const cancelOnServer = async () => {
    if (!upload) return
    await api.POST('/api/v1/adapters/{adapter_name}/uploads/{public_id}/abort', {
      params: { path: { adapter_name: adapter, public_id: upload.id } },
    })
  }

  // Uppy's upload() may never settle once cancelled; the caller hears of the cancel at once.
  const cancelled = new Promise<never>((_, reject) => abort.signal.addEventListener('abort', () => reject(cancelledError()), { once: true }))
  const promise = Promise.race([run(), cancelled]).finally(() => uppy?.destroy())
  return {
    promise,
    cancel: () => {
      abort.abort()
      uppy?.cancelAll()
      void cancelOnServer()
    },
    resume: () => resumeNow?.(),
  } satisfies UploadHandle
}
