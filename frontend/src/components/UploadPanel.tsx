// Upload a PEFT folder (drag and drop, or pick a folder / files / one archive) with per-file and overall
// progress, cancel, and resume after a dropped connection. Bytes go straight to S3 (s3upload.ts); the version
// then appears in the adapter's list and turns ready or rejected live.
import { Alert, Button, Group, Paper, Progress as Bar, Select, Stack, Text, TextInput } from '@mantine/core'
import { useRef, useState } from 'react'
import { versionLabel } from '../format'
import { s3Uploader } from './s3upload'
import { pickAdapterFiles, filesFromDrop, type Progress, type Uploader, type UploadHandle } from './upload'

export interface UploadPanelProps {
  baseModels: string[]
  defaultAdapter?: string
  lockAdapter?: boolean
  uploader?: Uploader
  onUploaded?: (version: { adapter: string; number: number; status: string }) => void
}

const fmt = (n: number) => (n >= 1 << 20 ? `${(n / (1 << 20)).toFixed(1)} MiB` : `${(n / 1024).toFixed(1)} KiB`)

export function UploadPanel({ baseModels, defaultAdapter = '', lockAdapter = false, uploader = s3Uploader, onUploaded }: UploadPanelProps) {
  const [adapter, setAdapter] = useState(defaultAdapter)
  const [baseModel, setBaseModel] = useState<string | null>(baseModels[0] ?? null)
  const [files, setFiles] = useState<File[]>([])
  const [pickError, setPickError] = useState<string | null>(null)
  const [progress, setProgress] = useState<Progress | null>(null)
  const [result, setResult] = useState<{ ok: boolean; text: string } | null>(null)
  const [busy, setBusy] = useState(false)
  // The adapter these chosen files were just uploaded to: Upload stayed enabled after a success, and a second click
  // made a duplicate version. Choosing files (or another adapter name) enables it again.
  const [uploadedTo, setUploadedTo] = useState<string | null>(null)
  const [over, setOver] = useState(false)
  const handleRef = useRef<UploadHandle | null>(null)

  const choose = (list: File[]) => {
    const picked = pickAdapterFiles(list)
    setFiles(picked.files)
    setPickError(picked.error)
    setProgress(null)
    setResult(null)
    setUploadedTo(null)
  }

  const start = async () => {
    setBusy(true)
    setResult(null)
    const handle = uploader(adapter, files, lockAdapter ? null : baseModel, setProgress)
    handleRef.current = handle
    try {
      const { status, body } = await handle.promise
      if (status < 300) {
        // The upload is done; validation runs on: say so rather than the transient status `uploaded`.
        const label = versionLabel(body.adapter, body.number)
        // The adapters page has no versions list: point at the row that opens the adapter's page, where it is.
        const where = lockAdapter ? 'status and report in the versions list below' : `open ${body.adapter} in the list above for its status and report`
        setResult({
          ok: true,
          text: body.status === 'uploaded' ? `Uploaded ${label}; it is being validated (${where}).` : `Uploaded ${label}: ${body.status}.`,
        })
        setUploadedTo(adapter)
        onUploaded?.(body)
      } else {
        setResult({ ok: false, text: body?.detail ?? `Upload failed (HTTP ${status}).` })
      }
    } catch (e) {
      setResult({ ok: false, text: (e as Error).message })
      setProgress(null)
    } finally {
      setBusy(false)
      handleRef.current = null
    }
  }

  const overall = progress ? Math.round((progress.loaded / Math.max(progress.total, 1)) * 100) : 0
  const totalBytes = files.reduce((a, f) => a + f.size, 0)
  const phaseText = result
    ? null
    : progress?.phase === 'hashing'
      ? `Computing sha256 · ${Math.round(((progress.hashed ?? 0) / Math.max(totalBytes, 1)) * 100)} %`
      : progress?.phase === 'verifying'
        ? 'Uploaded; the server is checking sizes and sha256…'
        : null
  const validName = /^(?=[a-z0-9-]{1,40}$)[a-z0-9]+(?:-[a-z0-9]+)*$/.test(adapter)
  // Why Upload is off, for the hint beside it (null: it is on). While one is in flight the button shows its loader.
  const blocked = busy
    ? null
    : files.length === 0
      ? 'Choose the adapter files first.'
      : !validName
        ? null // the name field says why
        : !lockAdapter && !baseModel
          ? 'Pick a base model first.'
          : pickError
            ? null // the alert above says why
            : uploadedTo === adapter
              ? 'These files are uploaded; choose files again to upload another version.'
              : null
  const canUpload = !busy && files.length > 0 && validName && !pickError && (lockAdapter || !!baseModel) && uploadedTo !== adapter

  return (
    <Paper withBorder p="md" radius="md">
      <Stack gap="sm">
        <Group grow align="flex-start" wrap="wrap">
          <TextInput
            label="Adapter name"
            description={'Lowercase letters, digits, hyphens; applications send it as the "model" field.'}
            value={adapter}
            onChange={(e) => setAdapter(e.currentTarget.value)}
            disabled={lockAdapter || busy}
            error={adapter && !validName ? 'Use 1-40 lowercase letters, digits or single hyphens.' : null}
          />
          {!lockAdapter && (
            <Select label="Base model" data={baseModels} value={baseModel} onChange={(v) => setBaseModel(v as string | null)} disabled={busy} allowDeselect={false} />
          )}
        </Group>
        <Paper
          withBorder
          p="lg"
          radius="md"
          bg={over ? 'var(--mantine-color-blue-light)' : undefined}
          style={{ borderStyle: 'dashed', textAlign: 'center' }}
          onDragOver={(e) => {
            e.preventDefault()
            setOver(true)
          }}
          onDragLeave={() => setOver(false)}
          onDrop={async (e) => {
            e.preventDefault()
            setOver(false)
            choose(e.dataTransfer.items?.length ? await filesFromDrop(e.dataTransfer.items) : [...e.dataTransfer.files])
          }}
          data-testid="dropzone"
        >
          <Text>Drop the PEFT folder (adapter_config.json + adapter_model.safetensors) or one .zip / .tar.gz here</Text>
          <Group justify="center" mt="sm">
            <Button component="label" variant="default" disabled={busy}>
              Choose folder
              <input
                hidden
                type="file"
                aria-label="Choose adapter folder"
                {...({ webkitdirectory: '', directory: '' } as Record<string, string>)}
                onChange={(e) => choose([...(e.currentTarget.files ?? [])])}
              />
            </Button>
            <Button component="label" variant="default" disabled={busy}>
              Choose files
              <input hidden type="file" multiple aria-label="Choose adapter files" onChange={(e) => choose([...(e.currentTarget.files ?? [])])} />
            </Button>
          </Group>
        </Paper>
        {pickError && <Alert color="orange">{pickError}</Alert>}
        {files.length > 0 && (
          <Stack gap={6} aria-label="Files to upload">
            {files.map((f, i) => (
              <div key={f.name}>
                <Group justify="space-between" gap="xs">
                  <Text size="sm">{f.name}</Text>
                  <Text size="sm" c="dimmed">
                    {fmt(f.size)} · {Math.round((progress?.perFile[i] ?? 0) * 100)} %
                  </Text>
                </Group>
                <Bar value={(progress?.perFile[i] ?? 0) * 100} size="sm" aria-label={`${f.name} progress`} />
              </div>
            ))}
            <Group justify="space-between">
              <Text size="sm" fw={600}>
                Overall
              </Text>
              <Text size="sm" data-testid="overall-progress">
                {overall} %
              </Text>
            </Group>
            <Bar value={overall} aria-label="Overall progress" />
            {phaseText && (
              <Text size="sm" c="dimmed" data-testid="upload-phase">
                {phaseText}
              </Text>
            )}
          </Stack>
        )}
        <Group>
          <Button onClick={start} disabled={!canUpload} loading={busy}>
            Upload
          </Button>
          {blocked && (
            <Text size="sm" c="dimmed" data-testid="upload-blocked">
              {blocked}
            </Text>
          )}
          {busy && (
            <Button variant="outline" color="red" onClick={() => handleRef.current?.cancel()}>
              Cancel
            </Button>
          )}
        </Group>
        {busy && progress?.stalled && (
          <Alert color="orange" title="Upload paused">
            <Group justify="space-between">
              <Text size="sm">{progress.stalled}</Text>
              <Button size="xs" onClick={() => handleRef.current?.resume?.()}>
                Resume
              </Button>
            </Group>
          </Alert>
        )}
        {result && (
          <Alert color={result.ok ? 'green' : 'red'} role="status">
            {result.text}
          </Alert>
        )}
      </Stack>
    </Paper>
  )
}
