package org.onphonellm.trainer.core

import java.io.File

/**
 * Which source a Generate request runs on ([resolve]). The screen names its chosen program ([requested]); the latest
 * run is used when it is of that program (its trained or live state is the "after" side), else the program alone
 * generates with its own adapter: Generate works before any run exists, as on iOS.
 */
sealed class GenerateTarget {
    class Run(val dir: RunDir) : GenerateTarget()
    class Program(val name: String) : GenerateTarget()

    companion object {
        /**
         * [latest]: the latest run (null: none); [latestProgram]: that run's program (run.json `program`); [requested]: the
         * program the request names (null: an adb request without one, which takes the latest run).
         */
        fun resolve(latest: RunDir?, latestProgram: String?, requested: String?): GenerateTarget = when {
            requested == null && latest != null -> Run(latest)
            requested == null -> throw BadInput("no run and no program to generate with: import a program first")
            latest != null && latestProgram != null && File(latestProgram).name == requested -> Run(latest)
            else -> Program(requested)
        }
    }
}
