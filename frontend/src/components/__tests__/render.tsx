import { MantineProvider } from '@mantine/core'
import { render } from '@testing-library/react'
import type { ReactElement, ReactNode } from 'react'

const Wrapper = ({ children }: { children: ReactNode }) => <MantineProvider>{children}</MantineProvider>

/** render() inside a MantineProvider that also survives rerender(). */
export const renderWithMantine = (ui: ReactElement) => render(ui, { wrapper: Wrapper })
