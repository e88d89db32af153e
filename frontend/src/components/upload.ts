// Upload transports. The console uses the browser-direct one (s3upload.ts: presigned S3 multipart through Uppy);
// xhrUploader is the through-Django path that API users also have: one multipart POST to
// /api/v1/adapters/{name}/versions over XMLHttpRequest (fetch reports no upload progress), files in order, so each
// file's progress is its slice of the bytes sent.
import { consoleHeaders } from '../api/client'

export const SERVED_FILES = ['adapter_config.json', 'adapter_model.safetensors']
const ARCHIVE = /\.(zip|tar|tar\.gz|tgz|tar\.bz2|tbz2|tar\.xz|txz)$/i

export interface Progress {
  loaded: number
  total: number
  perFile: number[] // 0..1 per file, in the order given
  phase?: 'hashing' | 'uploading' | 'verifying'
  hashed?: number // bytes hashed so far, while hashing
  stalled?: string | null // why the upload waits (a dropped connection); resume() continues it
}

export interface UploadHandle {
  promise: Promise<{ status: number; body: any }>
  cancel: () => void
  resume?: () => void // after a dropped connection: list the parts S3 holds and send the rest
}

export type Uploader = (
  adapter: string,
  files: File[],
  baseModel: string | null,
  onProgress: (p: Progress) => void,
) => UploadHandle

/** Keeps what the server stores (the two PEFT files) or one archive; says why when the pick cannot work. */
export function pickAdapterFiles(files: File[]): { files: File[]; error: string | null } {
  const archives = files.filter((f) => ARCHIVE.test(f.name))
  if (archives.length === 1 && files.length === 1) return { files: archives, error: null }
  const byName = new Map(files.map((f) => [f.name, f]))
  const picked = SERVED_FILES.map((n) => byName.get(n)).filter((f): f is File => f !== undefined)
  const missing = SERVED_FILES.filter((n) => !byName.has(n))
  if (missing.length) return { files: picked, error: `Missing ${missing.join(' and ')}: drop the PEFT folder or one .zip/.tar.gz.` }
  return { files: picked, error: null }
}

export function perFileProgress(sizes: number[], loaded: number, total: number): number[] {
  // Multipart framing adds a little to `total`; scale the bytes sent onto the files' bytes.
  const sum = sizes.reduce((a, b) => a + b, 0)
  const sent = total > 0 ? (loaded / total) * sum : 0
  let offset = 0
  return sizes.map((size) => {
    const done = Math.min(Math.max(sent - offset, 0), size)
    offset += size
    return size === 0 ? (sent >= offset ? 1 : 0) : done / size
  })
}

export const xhrUploader: Uploader = (adapter, files, baseModel, onProgress) => {
  const xhr = new XMLHttpRequest()
  const form = new FormData()
  for (const f of files) form.append('files', f, f.name)
  if (baseModel) form.append('base_model', baseModel)
  const sizes = files.map((f) => f.size)
  const promise = new Promise<{ status: number; body: any }>((resolve, reject) => {
    xhr.upload.onprogress = (e) => onProgress({ loaded: e.loaded, total: e.total, perFile: perFileProgress(sizes, e.loaded, e.total) })
    xhr.onload = () => {
      let body: any = null
      try {
        body = JSON.parse(xhr.responseText)
      } catch {
        body = { detail: xhr.responseText }
      }
      if (xhr.status < 300) onProgress({ loaded: 1, total: 1, perFile: sizes.map(() => 1) })
      resolve({ status: xhr.status, body })
    }
    xhr.onerror = () => reject(new Error('The connection dropped during the upload; try again.'))
    xhr.onabort = () => reject(Object.assign(new Error('Upload cancelled.'), { cancelled: true }))
  })
  xhr.open('POST', `/api/v1/adapters/${encodeURIComponent(adapter)}/versions`)
  for (const [k, v] of Object.entries(consoleHeaders('POST'))) xhr.setRequestHeader(k, v)
  xhr.send(form)
  return { promise, cancel: () => xhr.abort() }
}

/** All files under dropped folders (DataTransfer entries), flattened; plain files pass through. */
export async function filesFromDrop(items: DataTransferItemList): Promise<File[]> {
  const out: File[] = []
  const walk = async (entry: any): Promise<void> => {
    if (entry.isFile) {
      out.push(await new Promise<File>((res, rej) => entry.file(res, rej)))
    } else if (entry.isDirectory) {
      const reader = entry.createReader()
      for (;;) {
        const batch: any[] = await new Promise((res, rej) => reader.readEntries(res, rej))
        if (batch.length === 0) break
        for (const e of batch) await walk(e)
      }
    }
  }
  const entries = [...items].map((i) => (i.webkitGetAsEntry ? i.webkitGetAsEntry() : null))
  for (const e of entries) if (e) await walk(e)
  return out
}
