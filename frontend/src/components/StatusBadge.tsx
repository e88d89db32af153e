import { Badge, Loader } from '@mantine/core'

const COLORS: Record<string, string> = { ready: 'green', rejected: 'red', validating: 'blue', uploaded: 'gray' }

/** A version's status (uploaded → validating → ready | rejected); a spinner while it is still moving. */
export function StatusBadge({ status }: { status: string }) {
  const busy = status === 'uploaded' || status === 'validating'
  return (
    <Badge color={COLORS[status] ?? 'gray'} variant="light" leftSection={busy ? <Loader size={10} /> : null}>
      {status}
    </Badge>
  )
}

export const isSettled = (status: string) => status === 'ready' || status === 'rejected'
