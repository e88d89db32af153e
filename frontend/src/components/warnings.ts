// Counting a validation report's warnings, apart from the report's component (fast refresh needs component-only files).
import type { Report } from './ValidationReport'

/** How many of a report's problems are warnings (a ready version can carry them: `adapter_untrained`, `no_effect`);
 * 0 for a report not written yet. */
export function warningCount(report: Report | null | undefined): number {
  return (report?.problems ?? []).filter((p) => p.severity === 'warning').length
}
