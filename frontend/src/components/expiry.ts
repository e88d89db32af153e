// A key's expiry as the console asks for it: a date picker (the locale's date order) and a 24-hour time typed as
// HH:MM. The browser's datetime-local picker showed a 12-hour clock with AM/PM in en-US, unlike every time the
// console writes (format.ts: always 24-hour).

/** What the two expiry fields mean: `iso` is the instant to send (`null`: never expires) unless `error` says what to
 * fix, keyed by the field to mark (`date` or `time`). `date` is `YYYY-MM-DD` (the date input's value), `time` is
 * `H:MM` or `HH:MM` on a 24-hour clock in the browser's time zone; an empty time is midnight (00:00). */
export function expiryInstant(date: string, time: string): { iso: string | null; error: { field: 'date' | 'time'; text: string } | null } {
  const t = time.trim()
  if (!date) {
    return t ? { iso: null, error: { field: 'date', text: 'Pick a date for the expiry, or clear the time.' } } : { iso: null, error: null }
  }
  const m = /^([01]?\d|2[0-3]):([0-5]\d)$/.exec(t || '00:00')
  if (!m) return { iso: null, error: { field: 'time', text: 'Use a 24-hour time, HH:MM (e.g. 17:30).' } }
  const at = new Date(`${date}T${m[1].padStart(2, '0')}:${m[2]}:00`) // no zone: the browser's local time
  if (Number.isNaN(at.getTime())) return { iso: null, error: { field: 'date', text: 'Pick a date as YYYY-MM-DD.' } }
  return { iso: at.toISOString(), error: null }
}
