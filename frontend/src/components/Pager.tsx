// Paging for the operator lists the API answers a page at a time (`?limit=&offset=`, DRF's
// `{count, next, previous, results}`): the fleet's nodes and the residency map grow with the platform, so the console
// asks for one bounded page and shows where it is.
import { Group, Pagination, Text } from '@mantine/core'
import { pageCount } from './paging'

/** "1–12 of 64" and the page buttons; nothing when everything fits on one page. */
export function Pager({ label, page, size, count, onChange }: {
  label: string
  page: number
  size: number
  count: number
  onChange: (page: number) => void
}) {
  if (count <= size) return null
  const first = (page - 1) * size + 1
  return (
    <Group gap="sm">
      <Pagination aria-label={label} total={pageCount(count, size)} value={page} onChange={onChange} size="sm" />
      <Text size="sm" c="dimmed">{`${first}–${Math.min(count, page * size)} of ${count}`}</Text>
    </Group>
  )
}
