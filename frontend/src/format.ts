// How the console writes instants: the user's locale for the date, always a 24-hour clock, in the browser's time
// zone. Every page and chart goes through these, so a time reads the same everywhere ("21:49:32", never "9:49:32 PM").

export type TimeInput = string | number | Date

/** `timeZone` and `locale` default to the browser's; tests pin them. */
export type FormatOptions = { timeZone?: string; locale?: string }

// hourCycle 'h23', not hour12: false, which some engines and locales render midnight with as "24:00".
const CLOCK = { hourCycle: 'h23', hour: '2-digit', minute: '2-digit' } as const

const toDate = (value: TimeInput) => (value instanceof Date ? value : new Date(value))

/** A date and time: the locale's date order, then a 24-hour `HH:MM:SS` (e.g. "12/01/2026, 21:49:32" in en-US). */
export function formatDateTime(value: TimeInput, opts: FormatOptions = {}): string {
  return new Intl.DateTimeFormat(opts.locale, {
    year: 'numeric', month: '2-digit', day: '2-digit', ...CLOCK, second: '2-digit', timeZone: opts.timeZone,
  }).format(toDate(value))
}

/** A time of day on a 24-hour clock: `HH:MM:SS`, or `HH:MM` with `seconds: false` (chart axes). */
export function formatTime(value: TimeInput, opts: FormatOptions & { seconds?: boolean } = {}): string {
  return new Intl.DateTimeFormat(opts.locale, {
    ...CLOCK, ...(opts.seconds === false ? {} : { second: '2-digit' }), timeZone: opts.timeZone,
  }).format(toDate(value))
}
