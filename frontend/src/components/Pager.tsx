// Paging for the operator lists the API answers a page at a time (`?limit=&offset=`, DRF's
// `{count, next, previous, results}`): the fleet's nodes and the residency map grow with the platform, so the console
// asks for one bounded page and shows where it is.
import { Group, Pagination, Text } from '@mantine/core'
import { useEffect } from 'react'

/** Pages needed for `count` rows at `size` a page (at least 1, so an empty list is page 1 of 1). */
export const pageCount = (count: number, size: number): number => Math.max(1, Math.ceil(count / size))

/** The API's query for 1-based `page` at `size` rows a page. */
export const pageQuery = (page: number, size: number): { limit: number; offset: number } => ({ limit: size, offset: (page - 1) * size })

/** Moves `page` back to the last page when the list shrank under it (a node deregistered, a version evicted), so a
 * poll never leaves the view on an empty page past the end. */
export function useClampedPage(page: number, setPage: (p: number) => void, count: number | undefined, size: number): void {
  useEffect(() => {
    if (count != null && page > pageCount(count, size)) setPage(pageCount(count, size))
  }, [count, page, size, setPage])
}

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
