import { screen, within } from '@testing-library/react'
import { describe, expect, it } from 'vitest'
import { ValidationReport, type Report } from '../ValidationReport'
import { warningCount } from '../warnings'
import { renderWithMantine } from './render'

const report: Report = {
  schema: 1,
  ok: false,
  facts: {},
  problems: [
    { code: 'untrained_adapter', severity: 'warning', field: null, message: 'lora_B is all zeros.', hint: 'Train it.' },
    {
      code: 'adapter_rank_too_high', severity: 'error', field: 'r',
      message: "The adapter's rank 64 is above max_lora_rank 16.", hint: 'Train with r <= 16.',
    },
  ],
}

describe('ValidationReport', () => {
  it('lists errors first with code, field, message and fix hint', () => {
    renderWithMantine(<ValidationReport report={report} />)
    expect(screen.getByText('Rejected by validation')).toBeInTheDocument()
    expect(screen.getByText('1 error(s), 1 other finding(s).')).toBeInTheDocument()
    const rows = within(screen.getByRole('table', { name: 'Problems' })).getAllByRole('row').slice(1)
    expect(within(rows[0]).getByText('error')).toBeInTheDocument()
    expect(within(rows[0]).getByText('adapter_rank_too_high')).toBeInTheDocument()
    expect(within(rows[0]).getByText('r')).toBeInTheDocument()
    expect(within(rows[0]).getByText('Fix: Train with r <= 16.')).toBeInTheDocument()
    expect(within(rows[1]).getByText('warning')).toBeInTheDocument()
    expect(within(rows[1]).getByText('—')).toBeInTheDocument() // no field
  })

  it('says when a report passed or has not arrived', () => {
    const { rerender } = renderWithMantine(<ValidationReport report={{ ok: true, problems: [] }} />)
    expect(screen.getByText('Passed validation')).toBeInTheDocument()
    expect(screen.queryByRole('table')).toBeNull()
    rerender(<ValidationReport report={null} />)
    expect(screen.getByText('Validation has not finished yet.')).toBeInTheDocument()
  })
})

describe('warningCount', () => {
  it('counts the warnings a listed version carries, errors and infos aside', () => {
    expect(warningCount(report)).toBe(1)
    const info = { code: 'x', severity: 'info', field: null, message: 'm', hint: 'h' }
    expect(warningCount({ ok: true, problems: [report.problems[0], report.problems[0], info] })).toBe(2)
    expect(warningCount(null)).toBe(0) // validation not finished
  })
})
