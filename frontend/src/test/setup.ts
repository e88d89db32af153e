import '@testing-library/jest-dom/vitest'

// jsdom lacks these; Mantine and Recharts use them.
window.matchMedia ??= ((query: string) => ({
  matches: false, media: query, onchange: null, addListener() {}, removeListener() {},
  addEventListener() {}, removeEventListener() {}, dispatchEvent: () => false,
})) as unknown as typeof window.matchMedia
globalThis.ResizeObserver ??= class {
  observe() {}
  unobserve() {}
  disconnect() {}
} as unknown as typeof ResizeObserver
// Mantine's autosizing Textarea re-measures when web fonts load.
if (!('fonts' in document)) {
  Object.defineProperty(document, 'fonts', { value: { addEventListener() {}, removeEventListener() {} }, configurable: true })
}

import { cleanup } from '@testing-library/react'
import { afterEach } from 'vitest'

afterEach(cleanup) // without vitest globals, testing-library does not unmount between tests by itself
