import { describe, expect, it } from 'vitest'
import { formatDateTime, formatTime } from '../format'

const utc = { timeZone: 'UTC' }

describe('formatDateTime / formatTime', () => {
  it('writes every time on a 24-hour clock, even in a 12-hour locale', () => {
    const evening = '2026-12-01T21:49:32Z'
    expect(formatTime(evening, { ...utc, locale: 'en-US' })).toBe('21:49:32')
    expect(formatTime(evening, { ...utc, locale: 'en-US', seconds: false })).toBe('21:49')
    expect(formatDateTime(evening, { ...utc, locale: 'en-US' })).toBe('12/01/2026, 21:49:32')
    expect(formatDateTime(evening, { ...utc, locale: 'en-US' })).not.toMatch(/AM|PM/)
  })

  it("keeps the locale's date order and writes midnight as 00, never 24", () => {
    const midnight = '2026-12-01T00:05:00Z'
    expect(formatDateTime(midnight, { ...utc, locale: 'en-GB' })).toBe('01/12/2026, 00:05:00')
    expect(formatDateTime(midnight, { ...utc, locale: 'en-US' })).toBe('12/01/2026, 00:05:00')
    expect(formatTime(Date.parse(midnight), { ...utc, locale: 'en-US' })).toBe('00:05:00')
  })

  it("uses the browser's time zone unless told", () => {
    expect(formatTime('2026-12-01T21:49:32Z', { timeZone: 'Asia/Kolkata', locale: 'en-US' })).toBe('03:19:32')
  })
})
