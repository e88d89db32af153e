import { describe, expect, it } from 'vitest'
import { formatDateTime, formatRate, formatTime, modelLabel, tickFormat, timeTicks, versionLabel } from '../format'

const utc = { timeZone: 'UTC' }

describe('formatDateTime / formatTime', () => {
  it('writes every time on a 24-hour clock, even in a 12-hour locale', () => {
    const evening = '2026-12-01T21:49:32Z'
    expect(formatTime(evening, { ...utc, locale: 'en-US' })).toBe('21:49:32')
    expect(formatTime(evening, { ...utc, locale: 'en-US', seconds: false })).toBe('21:49')
    expect(formatDateTime(evening, { ...utc, locale: 'en-US' })).toBe('Dec 1, 2026, 21:49:32')
    expect(formatDateTime(evening, { ...utc, locale: 'en-US' })).not.toMatch(/AM|PM/)
  })

  it("keeps the locale's date order with the month as a word (12/07 is July or December), midnight as 00", () => {
    const midnight = '2026-12-07T00:05:00Z'
    expect(formatDateTime(midnight, { ...utc, locale: 'en-GB' })).toBe('7 Dec 2026, 00:05:00')
    expect(formatDateTime(midnight, { ...utc, locale: 'en-US' })).toBe('Dec 7, 2026, 00:05:00')
    expect(formatDateTime(midnight, { ...utc, locale: 'de-DE' })).toBe('7. Dez. 2026, 00:05:00')
    expect(formatDateTime(midnight, { ...utc, locale: 'en-US' })).not.toMatch(/\d+\/\d+\/\d+/)
    expect(formatTime(Date.parse(midnight), { ...utc, locale: 'en-US' })).toBe('00:05:00')
  })

  it('writes an unreadable instant as "—" instead of throwing', () => {
    expect(formatTime(Number.NaN)).toBe('—')
    expect(formatTime('not a time')).toBe('—')
    expect(formatDateTime('')).toBe('—')
  })

  it("uses the browser's time zone unless told", () => {
    expect(formatTime('2026-12-01T21:49:32Z', { timeZone: 'Asia/Kolkata', locale: 'en-US' })).toBe('03:19:32')
  })
})

describe('timeTicks', () => {
  const at = (hms: string) => Date.parse(`2026-12-01T${hms}Z`)
  const label = (ticks: number[]) => ticks.map(tickFormat(ticks))

  it('picks the smallest round step giving at most `count` ticks, on multiples of it', () => {
    expect(label(timeTicks(at('20:50:02'), at('21:49:32'), 5, 0))).toEqual(['21:00', '21:15', '21:30', '21:45'])
    expect(label(timeTicks(at('09:00:03'), at('09:01:58'), 5, 0))).toEqual(['09:00:30', '09:01:00', '09:01:30'])
    expect(label(timeTicks(at('00:00:00'), at('23:59:00'), 5, 0))).toEqual(['00:00', '06:00', '12:00', '18:00'])
  })

  it('aligns to the local clock in a zone off the hour, and copes with a single instant', () => {
    // UTC+05:30: quarter hours fall on :00/:15/:30/:45 local, which is :30/:45/:00/:15 UTC.
    const ticks = timeTicks(at('20:50:02'), at('21:49:32'), 5, 330)
    expect(ticks.map((t) => formatTime(t, { timeZone: 'Asia/Kolkata', seconds: false }))).toEqual(['02:30', '02:45', '03:00', '03:15'])
    expect(timeTicks(at('09:00:00'), at('09:00:00'))).toEqual([at('09:00:00')])
  })
})

describe('versionLabel / modelLabel', () => {
  it('names a version one way, whether the application sent the name or name@n', () => {
    expect(versionLabel('capitals', 3)).toBe('capitals v3')
    expect(versionLabel('capitals@3', 3)).toBe('capitals v3')
    expect(versionLabel('tiny-llama', null)).toBe('tiny-llama (base)')
    expect(versionLabel('acme/capitals', 1)).toBe('acme/capitals v1')
    // The usage chart's legend reads as the served names a client sends (issue 30), not the tables' `name vN`.
    expect(modelLabel('capitals@2')).toBe('capitals@2')
    expect(modelLabel('capitals')).toBe('capitals') // the version that answered is not known here
    // a refused request whose model was never found: stored without a name, never read as the base model
    expect(versionLabel('', null)).toBe('(no model)')
    expect(modelLabel('')).toBe('(no model)')
  })
})

describe('formatRate', () => {
  it('never writes a real but low rate as 0.0/s, however low (tokens included)', () => {
    expect(formatRate(16 / 3600)).toBe('16/h')
    expect(formatRate(0.5)).toBe('30/min')
    expect(formatRate(2.54)).toBe('2.5/s')
    expect(formatRate(42.4)).toBe('42/s')
    expect(formatRate(1 / 60)).toBe('1/min')
    expect(formatRate(1 / 86400)).toBe('0.042/h') // one token in a day
    expect(formatRate(0.049)).toBe('2.9/min') // the traffic table wrote 0.0 tokens/s
    expect(formatRate(0)).toBe('0/s')
  })
})
