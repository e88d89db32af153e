import { act, fireEvent, screen, waitFor } from '@testing-library/react'
import userEvent from '@testing-library/user-event'
import { describe, expect, it, vi } from 'vitest'
import { UploadPanel } from '../UploadPanel'
import { perFileProgress, pickAdapterFiles, type Progress, type Uploader } from '../upload'
import { renderWithMantine } from './render'

const file = (name: string, size: number) => new File([new Uint8Array(size)], name)
const FOLDER = [file('adapter_config.json', 100), file('adapter_model.safetensors', 900), file('README.md', 10)]

describe('pickAdapterFiles', () => {
  it('keeps the two served files of a folder, or one archive, and names what is missing', () => {
    expect(pickAdapterFiles(FOLDER).files.map((f) => f.name)).toEqual(['adapter_config.json', 'adapter_model.safetensors'])
    expect(pickAdapterFiles([file('a.tar.gz', 5)]).error).toBeNull()
    expect(pickAdapterFiles([file('adapter_config.json', 1)]).error).toMatch(/Missing adapter_model.safetensors/)
  })
})

describe('perFileProgress', () => {
  it('splits the bytes sent over the files in order', () => {
    expect(perFileProgress([100, 900], 0, 1000)).toEqual([0, 0])
    expect(perFileProgress([100, 900], 550, 1000)).toEqual([1, 0.5])
    expect(perFileProgress([100, 900], 1000, 1000)).toEqual([1, 1])
  })
})

function fakeUploader() {
  let report: (p: Progress) => void = () => {}
  let finish: (v: { status: number; body: unknown }) => void = () => {}
  let fail: (e: Error) => void = () => {}
  const cancel = vi.fn(() => fail(new Error('Upload cancelled.')))
  const resume = vi.fn()
  const uploader: Uploader = vi.fn((_a, _f, _b, onProgress) => {
    report = onProgress
    return { promise: new Promise<{ status: number; body: any }>((res, rej) => { finish = res; fail = rej }), cancel, resume }
  })
  return { uploader, cancel, resume, progress: (p: Progress) => act(() => report(p)), finish: (v: { status: number; body: unknown }) => finish(v) }
}

describe('UploadPanel', () => {
  it('shows per-file and overall progress, then the new version', async () => {
    const fake = fakeUploader()
    const onUploaded = vi.fn()
    renderWithMantine(<UploadPanel baseModels={['tiny-llama']} uploader={fake.uploader} onUploaded={onUploaded} />)
    await userEvent.type(screen.getByLabelText(/Adapter name/), 'capitals')
    fireEvent.change(screen.getByLabelText('Choose adapter folder'), { target: { files: FOLDER } })
    expect(screen.getByText('adapter_config.json')).toBeInTheDocument()
    expect(screen.queryByText('README.md')).toBeNull()
    await userEvent.click(screen.getByRole('button', { name: 'Upload' }))
    expect(fake.uploader).toHaveBeenCalledWith('capitals', expect.any(Array), 'tiny-llama', expect.any(Function))
    fake.progress({ loaded: 550, total: 1000, perFile: [1, 0.5] })
    expect(await screen.findByTestId('overall-progress')).toHaveTextContent('55 %')
    expect(screen.getByText(/100.0 B|0.1 KiB · 100 %/)).toBeInTheDocument()
    expect(screen.getByText(/0.9 KiB · 50 %/)).toBeInTheDocument()
    fake.progress({ loaded: 1000, total: 1000, perFile: [1, 1] })
    fake.finish({ status: 201, body: { adapter: 'capitals', number: 1, status: 'uploaded' } })
    expect(await screen.findByRole('status')).toHaveTextContent('Uploaded capitals v1; it is being validated')
    // On the adapters page there is no versions list to point at: the message names the row to open.
    expect(screen.getByRole('status')).toHaveTextContent('open capitals in the list above for its status and report')
    expect(screen.getByTestId('overall-progress')).toHaveTextContent('100 %')
    expect(onUploaded).toHaveBeenCalledWith({ adapter: 'capitals', number: 1, status: 'uploaded' })
  })

  it('cancels a running upload and shows the server error of a refused one', async () => {
    const fake = fakeUploader()
    renderWithMantine(<UploadPanel baseModels={['tiny-llama']} defaultAdapter="capitals" uploader={fake.uploader} />)
    fireEvent.change(screen.getByLabelText('Choose adapter files'), { target: { files: FOLDER } })
    await userEvent.click(screen.getByRole('button', { name: 'Upload' }))
    await userEvent.click(screen.getByRole('button', { name: 'Cancel' }))
    expect(fake.cancel).toHaveBeenCalled()
    expect(await screen.findByRole('status')).toHaveTextContent('Upload cancelled.')
    await userEvent.click(screen.getByRole('button', { name: 'Upload' }))
    fake.finish({ status: 413, body: { detail: 'Upload exceeds 10 bytes.', code: 'upload_too_large' } })
    await waitFor(() => expect(screen.getByRole('status')).toHaveTextContent('Upload exceeds 10 bytes.'))
  })

  it('keeps Upload off without files, while one is in flight, and after it for the same files', async () => {
    const fake = fakeUploader()
    renderWithMantine(<UploadPanel baseModels={['tiny-llama']} defaultAdapter="capitals" uploader={fake.uploader} />)
    const upload = screen.getByRole('button', { name: 'Upload' })
    expect(upload).toBeDisabled()
    expect(screen.getByTestId('upload-blocked')).toHaveTextContent('Choose the adapter files first.')
    fireEvent.change(screen.getByLabelText('Choose adapter files'), { target: { files: FOLDER } })
    expect(upload).toBeEnabled()
    await userEvent.click(upload)
    expect(upload).toBeDisabled() // in flight: a second click would start a second upload
    await userEvent.click(upload)
    expect(fake.uploader).toHaveBeenCalledTimes(1)
    fake.finish({ status: 201, body: { adapter: 'capitals', number: 1, status: 'uploaded' } })
    expect(await screen.findByRole('status')).toHaveTextContent('Uploaded capitals v1')
    // Done: the same files again would be a duplicate version (it stayed enabled and made one).
    expect(upload).toBeDisabled()
    expect(screen.getByTestId('upload-blocked')).toHaveTextContent('These files are uploaded; choose files again')
    await userEvent.clear(screen.getByLabelText(/Adapter name/))
    await userEvent.type(screen.getByLabelText(/Adapter name/), 'capitals-2') // the same files to another adapter: fine
    expect(upload).toBeEnabled()
    await userEvent.clear(screen.getByLabelText(/Adapter name/))
    await userEvent.type(screen.getByLabelText(/Adapter name/), 'capitals')
    expect(upload).toBeDisabled()
    fireEvent.change(screen.getByLabelText('Choose adapter files'), { target: { files: FOLDER } })
    expect(upload).toBeEnabled()
    expect(screen.queryByTestId('upload-blocked')).toBeNull()
  })

  it('keeps Upload off until a base model is picked', () => {
    renderWithMantine(<UploadPanel baseModels={[]} defaultAdapter="capitals" uploader={fakeUploader().uploader} />)
    fireEvent.change(screen.getByLabelText('Choose adapter files'), { target: { files: FOLDER } })
    expect(screen.getByRole('button', { name: 'Upload' })).toBeDisabled()
    expect(screen.getByTestId('upload-blocked')).toHaveTextContent('Pick a base model first.')
  })

  it('refuses a bad adapter name before uploading', async () => {
    renderWithMantine(<UploadPanel baseModels={['tiny-llama']} uploader={fakeUploader().uploader} />)
    await userEvent.type(screen.getByLabelText(/Adapter name/), 'Bad Name')
    fireEvent.change(screen.getByLabelText('Choose adapter files'), { target: { files: FOLDER } })
    expect(screen.getByText(/Use 1-40 lowercase/)).toBeInTheDocument()
    expect(screen.getByRole('button', { name: 'Upload' })).toBeDisabled()
  })

  it('shows hashing and verifying, and resumes after a dropped connection', async () => {
    const fake = fakeUploader()
    renderWithMantine(<UploadPanel baseModels={['tiny-llama']} defaultAdapter="capitals" uploader={fake.uploader} />)
    fireEvent.change(screen.getByLabelText('Choose adapter folder'), { target: { files: FOLDER } })
    await userEvent.click(screen.getByRole('button', { name: 'Upload' }))
    fake.progress({ loaded: 0, total: 1000, perFile: [0, 0], phase: 'hashing', hashed: 500 })
    expect(await screen.findByTestId('upload-phase')).toHaveTextContent('Computing sha256 · 50 %')
    fake.progress({ loaded: 400, total: 1000, perFile: [1, 0.33], phase: 'uploading', stalled: 'The connection dropped; the parts already in S3 are kept.' })
    expect(await screen.findByText(/The connection dropped/)).toBeInTheDocument()
    expect(screen.getByTestId('overall-progress')).toHaveTextContent('40 %')
    await userEvent.click(screen.getByRole('button', { name: 'Resume' }))
    expect(fake.resume).toHaveBeenCalledTimes(1)
    fake.progress({ loaded: 1000, total: 1000, perFile: [1, 1], phase: 'verifying' })
    expect(screen.queryByRole('button', { name: 'Resume' })).toBeNull()
    expect(screen.getByTestId('upload-phase')).toHaveTextContent(/checking sizes and sha256/)
    fake.finish({ status: 400, body: { detail: 'adapter_model.safetensors: the stored bytes have sha256 x, not the declared y.', code: 'sha256_mismatch' } })
    await waitFor(() => expect(screen.getByRole('status')).toHaveTextContent(/not the declared/))
  })

  it('drops the "checking sha256" line once the upload has answered (found by a fresh user: it stayed forever)', async () => {
    const fake = fakeUploader()
    renderWithMantine(<UploadPanel baseModels={['tiny-llama']} defaultAdapter="capitals" uploader={fake.uploader} />)
    fireEvent.change(screen.getByLabelText('Choose adapter files'), { target: { files: FOLDER } })
    await userEvent.click(screen.getByRole('button', { name: 'Upload' }))
    fake.progress({ loaded: 1000, total: 1000, perFile: [1, 1], phase: 'verifying' })
    expect(screen.getByTestId('upload-phase')).toHaveTextContent(/checking sizes and sha256/)
    fake.finish({ status: 201, body: { adapter: 'capitals', number: 2, status: 'uploaded' } })
    expect(await screen.findByRole('status')).toHaveTextContent('Uploaded capitals v2; it is being validated')
    expect(screen.queryByTestId('upload-phase')).toBeNull()
  })
})
