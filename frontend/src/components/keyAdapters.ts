// The "Only these adapters" input of the API keys page: a list of adapter names, checked with the API's rule
// (tenants/serializers.py ADAPTER_REF_RE) before anything is sent.

// An adapter name (1-40 lowercase letters, digits or single hyphens, a letter or digit at each end), then an
// optional @N (N ≥ 1): the API's pattern, so what passes here is never refused there.
const ADAPTER_REF = /^(?=[a-z0-9-]{1,40}(?:@|$))[a-z0-9]+(?:-[a-z0-9]+)*(?:@[1-9][0-9]{0,8})?$/

/** The input's names and what is wrong with them. Names are separated by commas or newlines only, never spaces:
 *  "nope bot" is one bad name (named in `error` with the rule), not the two names `nope` and `bot`. `names` keeps
 *  the valid entries in the order typed; `error` is null when every entry is valid. */
export function parseAdapterList(text: string): { names: string[]; error: string | null } {
  const entries = text.split(/[,\n]+/).map((s) => s.trim()).filter(Boolean)
  const bad = entries.filter((name) => !ADAPTER_REF.test(name))
  if (bad.length === 0) return { names: entries, error: null }
  const quoted = bad.map((name) => `"${name}"`).join(', ')
  return {
    names: entries.filter((name) => ADAPTER_REF.test(name)),
    error: `${quoted} ${bad.length === 1 ? 'is not an adapter name' : 'are not adapter names'}: use 1-40 lowercase `
      + 'letters, digits or single hyphens, starting and ending with a letter or digit, optionally followed by @N '
      + 'for version N alone (e.g. support-bot or ranker@2); separate names with commas.',
  }
}
