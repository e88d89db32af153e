// Paging arithmetic for the operator lists the API answers a page at a time (`?limit=&offset=`): kept apart from the
// Pager component so that file exports components only (React fast refresh).
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
